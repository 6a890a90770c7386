"""Where a git-managed source's config lives, and how a change reaches it (the source connection's extra; pure).

A source connection with ``extra.deploy: git`` names the team's config repository in ``extra.git``:

- ``url``: the repository (``https://…``, ``ssh://…``, ``git@host:…`` or, locally, a path / ``file://``);
- ``path``: the file in it; ``shape``: ``helm-values`` | ``prometheus-yml`` | ``manifest`` (``core.git_render``);
- ``branch``: the branch the team's sync (Argo CD, Flux, helm) deploys from (default ``main``);
- ``backend``: ``github`` (a branch and a pull request, merged by the team's review) or ``direct`` (a push to
  ``branch``, for teams without review; default ``direct``);
- ``github``: ``{repository: owner/name, api_url}`` for the ``github`` backend (``api_url`` defaults to
  GitHub's; GitHub Enterprise: ``https://HOST/api/v3``);
- ``conn_id``: the Airflow connection whose password is the token (HTTPS pushes and the REST API); the token
  never appears in the extra, a record or a message;
- ``author``: ``Name <email>`` of our commits; ``timeout_s``: how long the deploy waits for the sync to load
  the change before it rolls back (default 900; a review takes longer: raise it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from promshift.core.git_render import SHAPES

BACKENDS = ("github", "direct")
DEFAULT_API_URL = "https://api.github.com"
DEFAULT_AUTHOR = "promshift <promshift@localhost>"
DEFAULT_TIMEOUT_S = 900.0
_KEYS = frozenset({"url", "path", "shape", "branch", "backend", "github", "conn_id", "author", "timeout_s"})
_BRANCH = re.compile(r"^(?!/)(?!.*//)(?!.*\.\.)(?!.*@\{)[A-Za-z0-9._/-]{1,200}(?<![/.])$")
_REPOSITORY = re.compile(r"^[A-Za-z0-9_.-]{1,100}/[A-Za-z0-9_.-]{1,100}$")
_AUTHOR = re.compile(r"^[^<>\n]{1,100} <[^<>\s]{1,200}>$")


@dataclass(frozen=True)
class GitSource:
    url: str
    path: str
    shape: str
    branch: str = "main"
    backend: str = "direct"
    repository: str | None = None  # owner/name on GitHub (the github backend)
    api_url: str = DEFAULT_API_URL
    conn_id: str | None = None
    author: str = DEFAULT_AUTHOR
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def author_name(self) -> str:
        return self.author.split(" <")[0]

    @property
    def author_email(self) -> str:
        return self.author.split(" <", 1)[1].rstrip(">")

    def change_branch(self, group: str, run_id: str, action: str) -> str:
        """The branch a change request proposes from: ``promshift/<group>/<action>-<run id, made ref-safe>``."""
        safe = re.sub(r"[^A-Za-z0-9._-]+", "-", run_id).strip("-.")[:80] or "run"
        return f"promshift/{group}/{action}-{safe}"


def git_source_of(extra: Mapping[str, Any], *, conn_id: str = "promshift_source") -> GitSource:
    """The source connection's ``extra.git``; one-line errors naming the bad value (never a token)."""
    raw = extra.get("git")
    if not isinstance(raw, Mapping):
        raise ValueError(f"connection {conn_id!r}: extra.deploy 'git' needs extra.git: {{url, path, shape, "
                         "branch, backend}")
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise ValueError(f"connection {conn_id!r}: extra.git has unknown keys {unknown}")
    url, path = str(raw.get("url") or ""), str(raw.get("path") or "")
    if not url or any(c.isspace() for c in url) or url.startswith("-"):
        raise ValueError(f"connection {conn_id!r}: extra.git.url must name the repository, got {url!r}")
    if re.match(r"^[a-z+]+://[^/@]*:[^/@]*@", url):
        raise ValueError(f"connection {conn_id!r}: extra.git.url must not carry a password; put the token in "
                         "the connection named by extra.git.conn_id")
    if not path or path.startswith("/") or ".." in path.split("/") or path.startswith("-"):
        raise ValueError(f"connection {conn_id!r}: extra.git.path must be a relative path in the repository, "
                         f"got {path!r}")
    shape = str(raw.get("shape") or "")
    if shape not in SHAPES:
        raise ValueError(f"connection {conn_id!r}: extra.git.shape must be one of {', '.join(SHAPES)}, got {shape!r}")
    branch = str(raw.get("branch") or "main")
    if not _BRANCH.match(branch):
        raise ValueError(f"connection {conn_id!r}: extra.git.branch is not a branch name: {branch!r}")
    backend = str(raw.get("backend") or "direct").strip().lower()
    if backend not in BACKENDS:
        raise ValueError(f"connection {conn_id!r}: extra.git.backend must be one of {', '.join(BACKENDS)}, "
                         f"got {backend!r}")
    github = raw.get("github") or {}
    if not isinstance(github, Mapping):
        raise ValueError(f"connection {conn_id!r}: extra.git.github must be a mapping {{repository, api_url}}")
    repository = github.get("repository")
    if backend == "github" and not (isinstance(repository, str) and _REPOSITORY.match(repository)):
        raise ValueError(f"connection {conn_id!r}: extra.git.github.repository must be owner/name, got {repository!r}")
    api_url = str(github.get("api_url") or DEFAULT_API_URL).rstrip("/")
    if not re.match(r"^https?://[^\s/@]+(/[^\s@]*)?$", api_url):
        raise ValueError(f"connection {conn_id!r}: extra.git.github.api_url must be an http(s) URL, got {api_url!r}")
    author = str(raw.get("author") or DEFAULT_AUTHOR)
    if not _AUTHOR.match(author):
        raise ValueError(f"connection {conn_id!r}: extra.git.author must be 'Name <email>', got {author!r}")
    try:
        timeout_s = float(raw.get("timeout_s", DEFAULT_TIMEOUT_S))
    except (TypeError, ValueError):
        timeout_s = -1.0
    if not 0 < timeout_s <= 7 * 86400:
        raise ValueError(f"connection {conn_id!r}: extra.git.timeout_s must be a positive number of seconds "
                         "(at most 7 days)")
    return GitSource(url=url, path=path, shape=shape, branch=branch, backend=backend,
                     repository=repository if backend == "github" else None, api_url=api_url,
                     conn_id=str(raw["conn_id"]) if raw.get("conn_id") else None, author=author, timeout_s=timeout_s)
