"""The local stack's git component: a bare config repository, a sync stand-in and a GitHub API contract server.

``python -m promshift.local.stack.reconciler`` (``python -m promshift.local stack up --git``; the demo's
``DEPLOY=git``) runs, in one process:

- a bare git repository ``config.git`` under ``--state-dir``, made at the first start from the local source's
  config: the file's text without its ``remote_write`` entries becomes the base (what the chart renders from
  the rest of the values), the entries go into ``values.yaml`` (kube-prometheus-stack's Helm values,
  ``prometheus.prometheusSpec.remoteWrite``) committed by "platform-team" on ``main``;
- ``Reconciler``, a stand-in for Argo CD / Flux: every ``--interval`` seconds it reads ``main``'s tip; when it
  moved, it renders the file's entries (``core.git_render.entries_of``, any shape) onto the base config,
  writes the source Prometheus's config file (only when the text changes) and ``POST /-/reload`` s it. It
  renders exactly what the branch says, so a commit that drops our entry (someone's revert, a sync from
  another source of truth) drops it from the live config, as a real sync does. Given the source's process
  control (``--mode-switch``, LAB ONLY: the stack's pid file), values whose ``prometheus.agentMode`` is true by the
  chart's own test (Go template truth: ``{{- if .Values.prometheus.agentMode }}``, so the string ``"false"`` is an
  agent too) are rendered as kube-prometheus-stack renders them: a ``PrometheusAgent``, i.e. the same config
  without ``rule_files``, ``alerting`` and ``remote_read`` (``core.retire.agent_config``) and the source restarted
  with ``--enable-feature=agent`` (``core.retire.agent_argv``), as the operator replaces the server's pods; values
  without it restart the source as the server it was. Without process control such values are refused (a sync
  error, retried), never rendered as a server;
- ``github_api.GitHubContractServer`` over the same bare repository (``platform/gpu-monitoring``), with a
  token made at first start (``token``, mode 0600) and ``--merge-after`` seconds as the reviewer stand-in.

When ready (first render loaded by the source) it writes ``api.json``: its pid, the API's URL and port, the
repository's path, file, shape and branch, the interval; ``sync.json`` records each sync (the commit, when
it was seen, when the reload answered) for the docs' measurements.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from promshift.adapters.source_mode import probe_mode
from promshift.core.git_render import HELM_VALUES, add_entry, config_entry, entries_of
from promshift.core.render import add_remote_write
from promshift.core.retire import agent_argv, agent_config, is_agent_argv
from promshift.local.stack.github_api import GitHubContractServer

log = logging.getLogger(__name__)
REPO_DIR, BASE_FILE, TOKEN_FILE, ADDRESS_FILE, SYNC_FILE = "config.git", "base.yml", "token", "api.json", "sync.json"
VALUES_PATH, BRANCH, REPOSITORY = "values.yaml", "main", "platform/gpu-monitoring"
PLATFORM = ("platform-team", "platform@local")
VALUES_HEAD = ("# kube-prometheus-stack values for the GPU fleet's Prometheus (the local stack's config repository)\n"
               "# Synced onto the cluster by the local reconciler stand-in.\n"
               "prometheus:\n"
               "  prometheusSpec:\n"
               "    scrapeInterval: 5s\n"
               "    retention: 2d\n"
               "    remoteWrite: []\n"
               "grafana:\n"
               "  enabled: false\n")


def git(*args: str, cwd: Path | None = None) -> str:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd or "/"), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": PLATFORM[0], "GIT_AUTHOR_EMAIL": PLATFORM[1], "GIT_COMMITTER_NAME": PLATFORM[0],
           "GIT_COMMITTER_EMAIL": PLATFORM[1]}
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"git {args[0]} failed: {' '.join(done.stderr.split())[:300]}")
    return done.stdout


def init_repository(state_dir: Path, source_config: Path) -> tuple[Path, str]:
    """The bare repository and the base config, made from the source's config at the first start."""
    from promshift.local.stack.k8s_api import split_source_config

    repo, base_path = state_dir / REPO_DIR, state_dir / BASE_FILE
    if repo.exists() and base_path.exists():
        return repo, base_path.read_text()
    base, specs = split_source_config(source_config.read_text())
    values = VALUES_HEAD
    for spec in specs:
        values = add_entry(HELM_VALUES, values, config_entry(spec))
    state_dir.mkdir(parents=True, exist_ok=True)
    git("init", "--quiet", "--bare", "--initial-branch", BRANCH, str(repo))
    with tempfile.TemporaryDirectory(prefix="promshift-seed-") as tmp:
        work = Path(tmp) / "work"
        git("clone", "--quiet", str(repo), str(work))
        (work / VALUES_PATH).write_text(values)
        git("add", VALUES_PATH, cwd=work)
        git("commit", "--quiet", "-m", "kube-prometheus-stack values for the GPU fleet", cwd=work)
        git("push", "--quiet", "origin", f"HEAD:refs/heads/{BRANCH}", cwd=work)
    base_path.write_text(base)
    return repo, base


def render(base: str, shape: str, content: str) -> str:
    """The source's config as the sync renders it: the base with the file's entries, in order."""
    text = base
    for entry in entries_of(shape, content):
        text = add_remote_write(text, entry)
    return text


def wanted_mode(shape: str, content: str) -> str:
    """``agent`` when kube-prometheus-stack would render a ``PrometheusAgent`` from these values, else ``server``.

    The chart tests ``{{- if .Values.prometheus.agentMode }}``: Go template truth of what Helm loaded (YAML 1.1-ish:
    ``no``/``off`` are false), so any non-empty string, ``"false"`` included, is an agent; Python's truth of the
    YAML 1.1 value is the same test. Only the values shape has the switch."""
    if shape != HELM_VALUES:
        return "server"
    values = yaml.safe_load(content) or {}
    prometheus = values.get("prometheus") if isinstance(values, dict) else None
    return "agent" if isinstance(prometheus, dict) and bool(prometheus.get("agentMode")) else "server"


class Reconciler:
    """Pulls ``branch`` of the bare repository on an interval and renders ``path`` onto the source's config; with
    ``control`` (the source's process, LAB ONLY) an agent too, when the values say ``prometheus.agentMode``."""

    def __init__(self, repo: Path, *, base: str, config_path: Path, prometheus_url: str, interval_s: float,
                 path: str = VALUES_PATH, shape: str = HELM_VALUES, branch: str = BRANCH,
                 record: Path | None = None, control: Any = None, agent_path: str | os.PathLike[str] | None = None
                 ) -> None:
        self.repo, self.base, self.config_path = repo, base, config_path
        self.prometheus_url, self.interval_s = prometheus_url.rstrip("/"), interval_s
        self.path, self.shape, self.branch, self.record = path, shape, branch, record
        self.control, self.agent_path = control, agent_path
        # The server's command line, as the operator would derive it from the Prometheus resource: the one the
        # source runs with when the stand-in starts (a source that is an agent then has none).
        argv = tuple(control.argv()) if control is not None else ()
        self.server_argv = argv if argv and not is_agent_argv(argv) else ()
        self.restarts: list[str] = []  # the modes the source was restarted in, in order
        self.synced: str | None = None
        self.syncs: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()

    def tip(self) -> str:
        return git("--git-dir", str(self.repo), "rev-parse", f"refs/heads/{self.branch}").strip()

    def sync_once(self) -> bool:
        """Render the branch's tip if it moved; True when something was written and reloaded."""
        tip = self.tip()
        if tip == self.synced:
            return False
        seen = time.time()
        content = git("--git-dir", str(self.repo), "show", f"{tip}:{self.path}")
        text = render(self.base, self.shape, content)
        mode = wanted_mode(self.shape, content)
        restart: tuple[str, ...] = ()
        if mode == "agent" and self.control is None:
            raise RuntimeError(f"{self.path} at {tip[:12]} says prometheus.agentMode, but this stand-in has no "
                               "process control (--mode-switch) to run an agent; not synced")
        if mode == "agent":
            text = agent_config(text.encode()).decode()
        # With process control the source runs what the values say: an agent's pods, or the server's (again). A
        # source that is down is restarted only once this stand-in has restarted it before (an agent that failed to
        # start); otherwise its owner (the stack) is restarting it.
        running = probe_mode(self.prometheus_url) if self.control is not None else mode
        if running != mode and (running != "down" or self.restarts):
            if not self.server_argv:
                raise RuntimeError("the source's server command line is unknown (the stand-in started with the source "
                                   "an agent); restart the stack's git component with the source a server")
            restart = agent_argv(self.server_argv, str(self.agent_path)) if mode == "agent" else self.server_argv
        changed = not self.config_path.exists() or self.config_path.read_text() != text
        if changed:
            tmp = self.config_path.with_name(f".{self.config_path.name}.sync")
            tmp.write_text(text)
            os.chmod(tmp, self.config_path.stat().st_mode & 0o777 if self.config_path.exists() else 0o644)
            os.replace(tmp, self.config_path)
        if restart:  # the operator replaces the pods: a PrometheusAgent's, or the Prometheus's again
            self.restarts.append(mode)
            log.info("reconciler: %s says %s: restarting the source", self.path, mode)
            self.control.restart(restart)
        elif changed:
            request = urllib.request.Request(f"{self.prometheus_url}/-/reload", method="POST", data=b"")
            with urllib.request.urlopen(request, timeout=30) as resp:  # noqa: S310 - the local source
                resp.read()
        self.synced = tip
        self.syncs.append({"commit": tip, "seen_at": seen, "reloaded_at": time.time(), "changed": changed,
                           "mode": mode, "restarted": bool(restart)})
        if self.record is not None:
            self.record.write_text(json.dumps(self.syncs[-50:], indent=1))
        log.info("reconciler: synced %s (%s)", tip[:12], "config changed, reloaded" if changed else "no change")
        return changed

    def run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sync_once()
            except Exception as exc:  # noqa: BLE001 - a sync error is logged and retried, as a real sync does
                self.errors.append(str(exc))
                log.warning("reconciler: sync failed: %s", exc)

    def start(self) -> Reconciler:
        threading.Thread(target=self.run, name="reconciler", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()


def read_address(state_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    try:
        return json.loads((Path(state_dir) / ADDRESS_FILE).read_text())
    except (OSError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="promshift-local-git", description=__doc__)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, default=0, help="the GitHub API contract server's port (0: any free)")
    parser.add_argument("--config", type=Path, required=True, help="the source Prometheus's config file")
    parser.add_argument("--prometheus", required=True, help="the source Prometheus's URL (POST /-/reload)")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between pulls (Argo CD: 180 by default)")
    parser.add_argument("--mode-switch", default=None, metavar="JSON",
                        help="LAB ONLY: the source's process control (the stack's source_mode_extra), so values with "
                             "prometheus.agentMode restart the source as an agent")
    parser.add_argument("--merge-after", type=float, default=3.0,
                        help="the reviewer stand-in merges an open pull request this many seconds old")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    state_dir = args.state_dir.resolve()
    repo, base = init_repository(state_dir, args.config)
    token_path = state_dir / TOKEN_FILE
    if not token_path.exists():
        fd = os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(24))
    server = GitHubContractServer(repo, repository=REPOSITORY, token=token_path.read_text().strip(),
                                  port=args.port, merge_after_s=args.merge_after).start()
    control, agent_path = None, None
    if args.mode_switch:
        from promshift.adapters.source_mode import mode_switch_from_extra

        switch = mode_switch_from_extra(args.prometheus, json.loads(args.mode_switch))
        control, agent_path = switch.control, switch.agent_path
    reconciler = Reconciler(repo, base=base, config_path=args.config, prometheus_url=args.prometheus,
                            interval_s=args.interval, record=state_dir / SYNC_FILE, control=control,
                            agent_path=agent_path)
    reconciler.sync_once()
    reconciler.start()
    host, port = server.base_url.rsplit(":", 1)
    address = {"pid": os.getpid(), "url": server.base_url, "port": int(port), "repo": str(repo),
               "repository": REPOSITORY, "path": VALUES_PATH, "shape": HELM_VALUES, "branch": BRANCH,
               "interval_s": args.interval, "merge_after_s": args.merge_after,
               "started": datetime.now(UTC).isoformat()}
    tmp = state_dir / f".{ADDRESS_FILE}.tmp"
    tmp.write_text(json.dumps(address, indent=1))
    os.replace(tmp, state_dir / ADDRESS_FILE)
    print(f"git: repository {repo} ({VALUES_PATH}), GitHub API {server.base_url}, sync every {args.interval}s",
          flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    reconciler.stop()
    server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
