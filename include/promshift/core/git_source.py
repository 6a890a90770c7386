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
  the change before it rolls back (default 900; a review takes longer: raise it);
- ``http_loopback``: ``true`` lets a token go over plain ``http://`` to 127.0.0.1/localhost only (the local
  lab's contract servers); logged at every use. Otherwise a token travels only over ``https://``.

No URL may carry credentials, in any spelling (``HTTPS://user:pw@``, ``https://TOKEN@``): the token lives in
the connection ``conn_id`` names. ``ssh://git@host/…`` and ``git@host:…`` (a user name, no password) are SSH's
own addressing and stay allowed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from promshift.core.git_render import SHAPES
from promshift.core.redact import redact_text

BACKENDS = ("github", "direct")
DEFAULT_API_URL = "https://api.github.com"
DEFAULT_AUTHOR = "promshift <promshift@localhost>"
DEFAULT_TIMEOUT_S = 900.0
_KEYS = frozenset({"url", "path", "shape", "branch", "backend", "github", "conn_id", "author", "timeout_s",
                   "http_loopback"})
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
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
    http_loopback: bool = False  # a token may go over plain http to a loopback host (the lab), logged

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
        raise ValueError(f"connection {conn_id!r}: extra.git.url must name the repository, got "
                         f"{redact_text(url)!r}")
    credentials = url_credentials(url)
    if credentials:
        raise ValueError(f"connection {conn_id!r}: extra.git.url must not carry {credentials}; put the token in "
                         "the connection named by extra.git.conn_id")
    parts = [part.lower() for part in path.replace("\\", "/").split("/")]
    if not path or path.startswith("/") or ".." in parts or ".git" in parts or path.startswith("-"):
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
    if url_credentials(api_url) or not re.match(r"^https?://[^\s/@]+(/[^\s@]*)?$", api_url, re.IGNORECASE):
        raise ValueError(f"connection {conn_id!r}: extra.git.github.api_url must be an http(s) URL without "
                         f"credentials, got {redact_text(api_url)!r}")
    http_loopback = raw.get("http_loopback", False)
    if not isinstance(http_loopback, bool):
        raise ValueError(f"connection {conn_id!r}: extra.git.http_loopback must be true or false")
    if raw.get("conn_id"):  # a token will be sent: only over https, or to a loopback host when allowed
        for what, where in (("url", url), *((("github.api_url", api_url),) if backend == "github" else ())):
            problem = plain_http_problem(where, http_loopback)
            if problem:
                raise ValueError(f"connection {conn_id!r}: extra.git.{what}: {problem}")
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
                     conn_id=str(raw["conn_id"]) if raw.get("conn_id") else None, author=author, timeout_s=timeout_s,
                     http_loopback=http_loopback)


def url_credentials(url: str) -> str | None:
    """What credentials ``url`` carries ("a password", "a user name or token"), or None; any scheme spelling.

    SSH's user name (``ssh://git@host``, ``git@host:org/repo``) is addressing, not a credential: allowed."""
    parts = urlsplit(url.strip()) if "://" in url else None
    if parts is None or not parts.netloc or "@" not in parts.netloc:
        return None
    userinfo = parts.netloc.rsplit("@", 1)[0]
    if ":" in userinfo:
        return "a password"
    return None if parts.scheme.lower() in ("ssh", "git+ssh", "ssh+git") else "a user name or token"


def plain_http_problem(url: str, http_loopback: bool) -> str | None:
    """Why a token must not be sent to ``url`` (plain http), or None (https, SSH, a local path; or plain http to a
    loopback host with ``http_loopback``)."""
    parts = urlsplit(url.strip()) if "://" in url else None
    if parts is None or parts.scheme.lower() != "http":
        return None
    if http_loopback and (parts.hostname or "") in _LOOPBACK:
        return None
    return (f"{redact_text(url)} is plain http: the token would travel unencrypted; use https:// "
            "(http_loopback: true allows 127.0.0.1/localhost only, for a local lab)")
