"""Run Airflow locally (``airflow standalone``) wired to the local stack, and drive it over REST.

Used by ``make demo`` and the end-to-end test. Users come from the Simple auth manager
with passwords we generate; approvals go through the same REST endpoint the UI uses.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import requests

from promshift.settings import REPO_ROOT

log = logging.getLogger(__name__)

TRIGGER_USER = "sre-carol"
API_ATTEMPTS = 3
APPROVER_USERS = ("oncall-alice", "oncall-bob")


@dataclass
class LocalAirflow:
    """An ``airflow standalone`` process group under ``home``, listening on 127.0.0.1:``port``."""

    home: Path
    port: int
    extra_env: dict[str, str]
    passwords: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    # Where the process group's leader pid is written, so ``promshift stack down`` can stop an Airflow left running.
    pid_file: Path | None = None
    _tokens: dict[str, str] = field(default_factory=dict, repr=False)
    # On a loaded machine the API server can miss a deadline now and then: a token request or a
    # GET (safe to repeat) is tried API_ATTEMPTS times; a POST or PATCH (a trigger, an answer) never twice.
    request_timeout_s: float = 15.0
    retry_wait_s: float = 5.0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        users = ",".join([f"{TRIGGER_USER}:op"] + [f"{u}:user" for u in APPROVER_USERS])
        env = dict(os.environ)
        env.update({
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO_ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            # Paused until the demo asks: the bake watch (every minute in the demo profile) and groups scheduled
            # on another group's cut-over asset must not start on their own; trigger() unpauses its DAG.
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": users,
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.home / "passwords.json"),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.base_url,
            "AIRFLOW__API_AUTH__JWT_SECRET": self._secret("jwt"),
            "AIRFLOW__CORE__FERNET_KEY": "",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "600",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            # The worker's and the triggerer's log servers default to 8793/8794 on every interface: another
            # Airflow on the machine (a second demo, a test) already holds them. Free ports on 127.0.0.1 each.
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self._log_ports[0]),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(self._log_ports[1]),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        })
        env.update(self.extra_env)
        return env

    @cached_property
    def _log_ports(self) -> tuple[int, int]:
        from promshift.stack.local import find_free_ports

        worker, trigger = find_free_ports(2)
        return worker, trigger

    def _secret(self, name: str) -> str:
        path = self.home / f".{name}"
        if not path.exists():
            path.write_text(secrets.token_hex(32))
        return path.read_text()

    def start(self, *, timeout_s: float = 240) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        pw_file = self.home / "passwords.json"
        if not pw_file.exists():
            pw_file.write_text(json.dumps({u: secrets.token_urlsafe(12) for u in (TRIGGER_USER, *APPROVER_USERS)}))
            pw_file.chmod(0o600)
        self.passwords = json.loads(pw_file.read_text())
        self._tokens.clear()
        logf = open(self.home / "standalone.log", "ab")  # noqa: SIM115 (owned by the child)
        airflow_bin = str(Path(sys.executable).parent / "airflow")
        log.info("starting airflow standalone on %s (log %s)", self.base_url, self.home / "standalone.log")
        self.proc = subprocess.Popen([airflow_bin, "standalone"], env=self.env(), stdout=logf,
                                     stderr=subprocess.STDOUT, start_new_session=True, cwd=self.home)
        if self.pid_file is not None:
            self.pid_file.write_text(f"{self.proc.pid}\n")
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"airflow standalone exited ({self.proc.returncode}); see "
                                   f"{self.home / 'standalone.log'}")
            try:
                health = requests.get(f"{self.base_url}/api/v2/monitor/health", timeout=5).json()
                if all((health.get(k) or {}).get("status") == "healthy"
                       for k in ("metadatabase", "scheduler", "triggerer")):
                    log.info("airflow is healthy after %.0fs", timeout_s - (deadline - time.time()))
                    return
            except (requests.RequestException, ValueError):
                pass
            time.sleep(3)
        raise RuntimeError(f"airflow not healthy after {timeout_s:.0f}s; see {self.home / 'standalone.log'}")

    def stop(self, *, term_wait_s: float = 30.0, kill_wait_s: float = 10.0) -> None:
        """Stop standalone and everything it started: its whole process group, not just the leader.

        The leader can exit while its scheduler and workers are still shutting down (or ignore
        SIGTERM, as a waiting HITL task may): wait for the group to be gone, then SIGKILL it.
        """
        if self.proc is None:
            return
        if self.pid_file is not None:
            self.pid_file.unlink(missing_ok=True)
        pgid = self.proc.pid
        for sig, wait_s in ((signal.SIGTERM, term_wait_s), (signal.SIGKILL, kill_wait_s)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                return
            deadline = time.time() + wait_s
            while time.time() < deadline:
                self.proc.poll()  # reap the leader, so a zombie does not keep the group alive
                try:
                    os.killpg(pgid, 0)
                except ProcessLookupError:
                    return
                time.sleep(0.5)
        log.warning("airflow process group %d still has members after SIGKILL", pgid)

    # -- REST ----------------------------------------------------------------------------
    def _retrying(self, what: str, send: Callable[[], requests.Response]) -> requests.Response:
        for attempt in range(1, API_ATTEMPTS + 1):
            try:
                return send()
            except (requests.Timeout, requests.ConnectionError) as exc:
                if attempt == API_ATTEMPTS:
                    raise
                log.warning("Airflow's API did not answer %s (%s); trying again in %.0fs", what,
                            exc.__class__.__name__, self.retry_wait_s)
                time.sleep(self.retry_wait_s)
        raise AssertionError("unreachable")

    def load_passwords(self) -> dict[str, str]:
        """The demo users' passwords (``passwords.json``, 0600, written by ``start``), for an Airflow left running."""
        self.passwords = json.loads((self.home / "passwords.json").read_text())
        return self.passwords

    def token(self, user: str) -> str:
        """A bearer token for ``user``, asked for once per user and kept (Airflow's tokens last hours):
        a login per REST call took over 15 s on a loaded 2-core machine."""
        if user not in self._tokens:
            resp = self._retrying("POST /auth/token", lambda: requests.post(
                f"{self.base_url}/auth/token", json={"username": user, "password": self.passwords[user]},
                timeout=self.request_timeout_s))
            resp.raise_for_status()
            self._tokens[user] = resp.json()["access_token"]
        return self._tokens[user]

    def api(self, user: str, method: str, path: str, **kwargs: Any) -> Any:
        def send() -> requests.Response:
            return requests.request(method, f"{self.base_url}/api/v2{path}",
                                    headers={"Authorization": f"Bearer {self.token(user)}"},
                                    timeout=2 * self.request_timeout_s, **kwargs)

        resp = self._retrying(f"{method} {path}", send) if method == "GET" else send()
        if resp.status_code >= 400:
            raise RuntimeError(f"{method} {path} as {user}: HTTP {resp.status_code} {resp.text[:300]}")
        return resp.json() if resp.content else None

    def wait_for_dag(self, dag_id: str, *, timeout_s: float = 180) -> None:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            try:
                self.api(TRIGGER_USER, "GET", f"/dags/{dag_id}")
                return
            except RuntimeError:
                time.sleep(3)
        raise RuntimeError(f"DAG {dag_id} not parsed after {timeout_s:.0f}s; see {self.home}/logs")

    def trigger(self, dag_id: str, *, user: str = TRIGGER_USER) -> str:
        self.api(user, "PATCH", f"/dags/{dag_id}", json={"is_paused": False})
        run = self.api(user, "POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": {}})
        log.info("triggered %s run %s as %s", dag_id, run["dag_run_id"], user)
        return str(run["dag_run_id"])

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        data = self.api(TRIGGER_USER, "GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")
        return {ti["task_id"]: ti["state"] or "none" for ti in data["task_instances"]}

    def run_state(self, dag_id: str, run_id: str) -> str:
        return str(self.api(TRIGGER_USER, "GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"])

    def answer_approval(self, dag_id: str, run_id: str, task_id: str, *, user: str, choice: str,
                        comment: str) -> dict[str, Any]:
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/-1/hitlDetails"
        detail = self.api(user, "GET", path)
        log.info("approval request shown to %s: %s", user, detail.get("subject"))
        return self.api(user, "PATCH", path, json={"chosen_options": [choice], "params_input": {"comment": comment}})

    def follow(self, dag_id: str, run_id: str, *, timeout_s: float,
               on_state: Callable[[dict[str, str]], None] | None = None) -> str:
        """Poll until the run ends, logging each task state change; returns the run's final state."""
        deadline = time.time() + timeout_s
        seen: dict[str, str] = {}
        while time.time() < deadline:
            states = self.task_states(dag_id, run_id)
            for task, state in states.items():
                if seen.get(task) != state:
                    log.info("  %-18s %s", task, state)
            seen = states
            if on_state:
                on_state(states)
            state = self.run_state(dag_id, run_id)
            if state in ("success", "failed"):
                return state
            time.sleep(3)
        raise RuntimeError(f"run {run_id} of {dag_id} did not finish in {timeout_s:.0f}s; states {seen}")
