"""Run Airflow locally wired to the local stack, and drive it over REST.

``executor="local"``: ``airflow standalone`` (SQLite, LocalExecutor). ``executor="celery"``: Airflow's
components as separate processes — api-server, scheduler, dag-processor, triggerer and Celery workers
(``airflow celery worker``, one task at a time each) — on PostgreSQL with Redis as the broker
(``promshift.local.celery_lab``); each worker has a ``PROMSHIFT_HOME`` of its own, so nothing may rely on
one worker's disk. Either way every process is in one process group, which ``stop`` (and
``python -m promshift.local stack down``, through the pid file) ends as a whole.

Used by ``make demo`` and the end-to-end tests. Users come from the Simple auth manager
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
from typing import TYPE_CHECKING, Any

import requests

from promshift.adapters.settings import REPO_ROOT
from promshift.orchestration.approver_teams import TEAMS_VARIABLE

if TYPE_CHECKING:
    from promshift.core.catalog import MetricGroup
    from promshift.local.celery_lab import CeleryServices

log = logging.getLogger(__name__)

TRIGGER_USER = "sre-carol"
EXECUTORS = ("local", "celery")
# The separate components of a celery Airflow, in start order (the API server leads the process group).
CELERY_COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
API_ATTEMPTS = 3
APPROVER_USERS = ("oncall-alice", "oncall-bob")
# The source Prometheus' login for promshift's own /metrics (promshift.local.self_scrape): a viewer reads every
# group's migration DAG, and can neither trigger nor approve.
METRICS_USER = "prometheus"
# The demo's on-call rotation (catalog: gpu-memory's ``approvers: ["team:gpu-oncall"]``), as the Airflow Variable
# ``promshift_teams`` an on-call tool would keep current. It names the trigger user too: the approval leaves
# whoever triggered the run out, so only oncall-alice and oncall-bob are asked.
DEMO_TEAMS = {"gpu-oncall": [*APPROVER_USERS, TRIGGER_USER]}


def last_error(log_file: Path) -> str:
    """The last line of a process's log that names an error (else its last line), for a one-line failure."""
    try:
        lines = [line.strip() for line in log_file.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    errors = [line for line in lines if "Error" in line or "error" in line or "Exception" in line]
    return ((errors or lines or ["empty log"])[-1])[:300]


@dataclass
class LocalAirflow:
    """Airflow's process group under ``home``, its API on 127.0.0.1:``port``: ``airflow standalone``
    (``executor="local"``) or separate components with Celery workers (``executor="celery"``, ``celery``
    naming the broker, the databases and the workers)."""

    home: Path
    port: int
    extra_env: dict[str, str]
    passwords: dict[str, str] = field(default_factory=dict)
    # The process group's leader (standalone, or the celery API server).
    proc: subprocess.Popen[bytes] | None = None
    executor: str = "local"
    celery: CeleryServices | None = None
    # Every process started, by component name (``w1-<port>@host`` for a worker); the leader among them.
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    # Celery mode: environment only some components get (by component name), over ``extra_env``.
    component_env: dict[str, dict[str, str]] = field(default_factory=dict)
    # Where the process group leader's pid is written, so `python -m promshift.local stack down` can stop it.
    pid_file: Path | None = None
    _tokens: dict[str, str] = field(default_factory=dict, repr=False)
    # DAGs this lab unpaused (each once: trigger() of a shared migration DAG does not ask again).
    _unpaused: set[str] = field(default_factory=set, repr=False)
    # On a loaded machine the API server can miss a deadline now and then: a token request or a
    # GET (safe to repeat) is tried API_ATTEMPTS times; a POST or PATCH (a trigger, an answer) never twice.
    request_timeout_s: float = 15.0
    retry_wait_s: float = 5.0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, component: str | None = None) -> dict[str, str]:
        """The environment of every Airflow process; with ``component`` (celery), that process's own additions."""
        users = ",".join([f"{TRIGGER_USER}:op"] + [f"{u}:user" for u in APPROVER_USERS] + [f"{METRICS_USER}:viewer"])
        env = dict(os.environ)
        env.update({
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO_ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            # Paused until the demo asks: the bake watch (every minute in the demo profile) and the waves DAG
            # (scheduled on the cut-over assets of groups others depend on) must not start on their own;
            # trigger() unpauses its DAG.
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
        if self.executor == "celery":
            env.update(self._celery_env(component))
        return env

    def _celery_env(self, component: str | None) -> dict[str, str]:
        from promshift.local.demo_policy import SHARD_QUEUES_ENV
        from promshift.local.worker_name import HOSTNAME_CALLABLE, WORKER_NAME_ENV

        celery = self._celery
        env = {
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": celery.database_url("airflow"),
            # Airflow derives asyncpg from postgresql://; psycopg (v3) serves the async engine too.
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": celery.database_url("airflow", driver="psycopg_async"),
            "AIRFLOW__CELERY__BROKER_URL": celery.redis_url,
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{celery.database_url('airflow')}",
            # A real deployment, also when started by a test (tests/conftest.py sets unit test mode, whose
            # unit_tests.cfg points Celery's results at MySQL).
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": "1",
            "AIRFLOW__OPERATORS__DEFAULT_QUEUE": celery.queue,
            "AIRFLOW__API__WORKERS": "1",
            # Mapped parity shard i runs on worker i % n (promshift.local.demo_policy).
            SHARD_QUEUES_ENV: ",".join(celery.worker_queues()),
        }
        if component is not None:
            # Each process its own PROMSHIFT_HOME: state kept "locally" by one is not there for another.
            home = self.component_home(component)
            home.mkdir(parents=True, exist_ok=True)
            env["PROMSHIFT_HOME"] = str(home)
        env.update(self.component_env.get(component or "", {}))
        if component in celery.worker_names():
            # Airflow records this as the task instance's hostname: which worker ran it (the report's executor).
            env[WORKER_NAME_ENV] = component
            env["AIRFLOW__CORE__HOSTNAME_CALLABLE"] = HOSTNAME_CALLABLE
        return env

    @property
    def _celery(self) -> CeleryServices:
        if self.celery is None:
            raise ValueError("executor 'celery' needs LocalAirflow(celery=CeleryServices(...))")
        return self.celery

    def component_home(self, component: str) -> Path:
        """The ``PROMSHIFT_HOME`` of one celery-mode process (a directory of its own under ``homes/``)."""
        return self.home / "homes" / component.replace("@", "_")

    def worker_names(self) -> list[str]:
        return self._celery.worker_names() if self.executor == "celery" else []

    @cached_property
    def _log_ports(self) -> tuple[int, int]:
        from promshift.local.stack.local import find_free_ports

        worker, trigger = find_free_ports(2)
        return worker, trigger

    def _secret(self, name: str) -> str:
        path = self.home / f".{name}"
        if not path.exists():
            path.write_text(secrets.token_hex(32))
        return path.read_text()

    @property
    def _airflow_bin(self) -> str:
        return str(Path(sys.executable).parent / "airflow")

    def log_path(self, component: str) -> Path:
        return self.home / f"{component.replace('@', '_')}.log"

    def start(self, *, timeout_s: float = 240) -> None:
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}, got {self.executor!r}")
        self.home.mkdir(parents=True, exist_ok=True)
        pw_file = self.home / "passwords.json"
        if not pw_file.exists():
            pw_file.write_text(json.dumps({u: secrets.token_urlsafe(12)
                                           for u in (TRIGGER_USER, *APPROVER_USERS, METRICS_USER)}))
            pw_file.chmod(0o600)
        self.passwords = json.loads(pw_file.read_text())
        self._tokens.clear()
        self._unpaused.clear()
        deadline = time.time() + timeout_s
        try:
            if self.executor == "celery":
                self._start_celery(deadline)
            else:
                log.info("starting airflow standalone on %s (log %s)", self.base_url, self.log_path("standalone"))
                self._spawn("standalone", [self._airflow_bin, "standalone"])
            self._wait_healthy(deadline, timeout_s)
            self.set_variable(TEAMS_VARIABLE, json.dumps(DEMO_TEAMS))
        except BaseException:
            self.stop(term_wait_s=15.0)  # what did start must not outlive a failed start
            raise

    def _spawn(self, component: str, argv: list[str]) -> subprocess.Popen[bytes]:
        """Start one process, in the leader's process group (the first one started leads a new group).

        Standalone leads a session of its own; the celery components' leader only a group in this session,
        as a process may join only a group of its own session (setpgid).
        """
        logf = open(self.log_path(component), "ab")  # noqa: SIM115 (owned by the child)
        group: dict[str, Any]
        if self.proc is not None:
            group = {"process_group": self.proc.pid}
        else:
            group = {"process_group": 0} if self.executor == "celery" else {"start_new_session": True}
        proc = subprocess.Popen(argv, env=self.env(component if self.executor == "celery" else None), stdout=logf,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.home, **group)
        logf.close()
        self.procs[component] = proc
        if self.proc is None:
            self.proc = proc
            if self.pid_file is not None:
                self.pid_file.write_text(f"{proc.pid}\n")
        return proc

    def _start_celery(self, deadline: float) -> None:
        from promshift.local.demo_policy import LOCAL_SETTINGS

        celery = self._celery
        # The demo's cluster policy (parity shards pinned to workers, round robin), read by every component.
        (self.home / "config").mkdir(parents=True, exist_ok=True)
        (self.home / "config" / "airflow_local_settings.py").write_text(LOCAL_SETTINGS)
        migrate_log = self.log_path("db-migrate")
        log.info("airflow db migrate on PostgreSQL %s (log %s)", celery.database_url("airflow").split("@")[-1],
                 migrate_log)
        with open(migrate_log, "ab") as out:
            done = subprocess.run([self._airflow_bin, "db", "migrate"], env=self.env(), stdout=out,
                                  stderr=subprocess.STDOUT, cwd=self.home, timeout=max(60.0, deadline - time.time()))
        if done.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed ({done.returncode}); see {migrate_log}")
        argv = {
            "api-server": ["api-server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
            "scheduler": ["scheduler"],
            "dag-processor": ["dag-processor"],
            # Task logs are files in this AIRFLOW_HOME, read by the API server: no log server listening anywhere.
            "triggerer": ["triggerer", "--skip-serve-logs"],
        }
        for component in CELERY_COMPONENTS:
            self._spawn(component, [self._airflow_bin, *argv[component]])
        for name, own_queue in zip(celery.worker_names(), celery.worker_queues(), strict=True):
            self._spawn(name, [self._airflow_bin, "celery", "worker", "--celery-hostname", name,
                               "--queues", f"{celery.queue},{own_queue}", "--concurrency", "1", "--skip-serve-logs",
                               "--without-mingle", "--without-gossip",
                               "--pid", str(self.home / f"{name.replace('@', '_')}.pid")])
        log.info("started %s (logs %s/*.log)", ", ".join(f"{c} pid {p.pid}" for c, p in self.procs.items()),
                 self.home)

    def _wait_healthy(self, deadline: float, timeout_s: float) -> None:
        needed = ["metadatabase", "scheduler", "triggerer"] + (["dag_processor"] if self.executor == "celery" else [])
        workers = set(self.worker_names())
        healthy = False
        while time.time() < deadline:
            for component, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"airflow {component} exited ({proc.returncode}): "
                                       f"{last_error(self.log_path(component))}; see {self.log_path(component)}")
            if not healthy:
                try:
                    health = requests.get(f"{self.base_url}/api/v2/monitor/health", timeout=5).json()
                    healthy = all((health.get(k) or {}).get("status") == "healthy" for k in needed)
                except (requests.RequestException, ValueError):
                    pass
            if healthy and workers:
                try:
                    workers -= self._celery.workers_answering(sorted(workers))
                except Exception as exc:  # noqa: BLE001 - the broker may still be starting up
                    log.debug("celery ping: %s", exc)
            if healthy and not workers:
                log.info("airflow (%s executor) is healthy after %.0fs", self.executor,
                         timeout_s - (deadline - time.time()))
                return
            time.sleep(3)
        missing = f"; workers not answering: {', '.join(sorted(workers))}" if workers else ""
        raise RuntimeError(f"airflow not healthy after {timeout_s:.0f}s{missing}; see {self.home}/*.log")

    def worker_processes(self) -> list[dict[str, Any]]:
        """The Celery workers started: ``hostname`` (the Celery name), ``pid`` (the ``airflow celery worker``)."""
        return [{"hostname": name, "pid": self.procs[name].pid} for name in self.worker_names() if name in self.procs]

    def stop(self, *, term_wait_s: float = 30.0, kill_wait_s: float = 10.0) -> None:
        """Stop every Airflow process started (standalone, or each celery component): the whole process group.

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
                for proc in (self.proc, *self.procs.values()):
                    proc.poll()  # reap our children, so a zombie does not keep the group alive
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

    def token(self, user: str, *, fresh: bool = False) -> str:
        """A bearer token for ``user``, asked for once per user and kept (Airflow's tokens last hours):
        a login per REST call took over 15 s on a loaded 2-core machine. ``fresh``: a new one (one expiring)."""
        if fresh or user not in self._tokens:
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

    def set_connection(self, conn_id: str, conn: dict[str, Any], *, user: str = TRIGGER_USER) -> None:
        """Create or replace connection ``conn_id`` in Airflow's metadata database (REST API; ``conn`` as an
        ``AIRFLOW_CONN_*`` JSON: ``conn_type``, ``host``, ``extra`` as a mapping...). A task reads it when it
        runs, so a running Airflow can be re-pointed between runs. (An ``AIRFLOW_CONN_*`` variable of the same
        id in Airflow's environment would win over it.)"""
        body = {"connection_id": conn_id, **{k: v for k, v in conn.items() if k != "extra"}}
        if "extra" in conn:
            body["extra"] = conn["extra"] if isinstance(conn["extra"], str) else json.dumps(conn["extra"])
        if self.connection_exists(conn_id, user=user):
            self.api(user, "PATCH", f"/connections/{conn_id}", json=body)
            log.info("connection %s replaced in Airflow's database", conn_id)
        else:
            self.api(user, "POST", "/connections", json=body)
            log.info("connection %s created in Airflow's database", conn_id)

    def set_variable(self, key: str, value: str, *, user: str = TRIGGER_USER) -> None:
        """Create or replace Airflow Variable ``key`` in Airflow's metadata database (REST API)."""
        body = {"key": key, "value": value}
        try:
            self.api(user, "GET", f"/variables/{key}")
        except RuntimeError:
            self.api(user, "POST", "/variables", json=body)
        else:
            self.api(user, "PATCH", f"/variables/{key}", json=body)
        log.info("variable %s set in Airflow's database", key)

    def connection_exists(self, conn_id: str, *, user: str = TRIGGER_USER) -> bool:
        listed = self.api(user, "GET", "/connections", params={"connection_id_pattern": conn_id, "limit": 100})
        return any(c["connection_id"] == conn_id for c in listed["connections"])

    def delete_connection(self, conn_id: str, *, user: str = TRIGGER_USER) -> None:
        """Delete connection ``conn_id`` from Airflow's metadata database, if it is there."""
        if self.connection_exists(conn_id, user=user):
            self.api(user, "DELETE", f"/connections/{conn_id}")
            log.info("connection %s deleted from Airflow's database", conn_id)

    def unpause(self, dag_id: str, *, user: str = TRIGGER_USER) -> None:
        """Let the scheduler run the DAG on its schedule (the demo creates every DAG paused)."""
        self.api(user, "PATCH", f"/dags/{dag_id}", json={"is_paused": False})
        self._unpaused.add(dag_id)

    def trigger(self, dag_id: str, *, user: str = TRIGGER_USER, conf: dict[str, Any] | None = None) -> str:
        """``conf``: the trigger form's values (e.g. ``{"group": ...}`` for a DAG of every group). Unpauses the
        DAG the first time this lab triggers it: a migration DAG is shared by the groups of one target, and
        runs of them (the waves DAG's too) may be under way."""
        if dag_id not in self._unpaused:
            self.unpause(dag_id, user=user)
        run = self.api(user, "POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf or {}})
        log.info("triggered %s run %s as %s%s", dag_id, run["dag_run_id"], user,
                 f" (group {conf['group']})" if conf and "group" in conf else "")
        return str(run["dag_run_id"])

    def trigger_group(self, group: MetricGroup, *, user: str = TRIGGER_USER,
                      conf: dict[str, Any] | None = None) -> str:
        """Start ``group``'s migration: a run of its target's migration DAG (``group.dag_id``) with the group
        chosen in the form (``conf``: the form's other fields, e.g. ``dry_run``, ``reason``,
        ``accept_short_history``).

        As in production, a run accepts short history only when ``conf`` says so (the form's default is false):
        a scenario that switches a dashboard or moves a rule minutes into its dual-write passes
        ``accept_short_history: true`` itself (the lifecycle scenarios), or its panels and rules wait for the
        target's history (``core.horizon``; tests/integration/test_horizon_local.py shows the wait)."""
        return self.trigger(group.dag_id, user=user, conf={**(conf or {}), "group": group.name})

    def dag_runs(self, dag_id: str) -> list[dict[str, Any]]:
        """Every run of ``dag_id`` Airflow has (run id, run type, state, conf...), oldest first."""
        data = self.api(TRIGGER_USER, "GET", f"/dags/{dag_id}/dagRuns", params={"limit": 1000,
                                                                                  "order_by": "id"})
        return list(data["dag_runs"])

    def asset_events(self, uri: str) -> list[dict[str, Any]]:
        """The asset events Airflow recorded for the asset ``uri`` (source DAG, task, run, map index; extra), oldest
        first. Asked by name (a group's asset is named by its URI): ``/assets`` lists only assets some DAG
        references, and a group's asset emitted through an alias alone (no DAG scheduled on it) is not one."""
        data = self.api(TRIGGER_USER, "GET", "/assets/events", params={"name_pattern": uri, "limit": 1000,
                                                                        "order_by": "timestamp"})
        return [e for e in data["asset_events"] if e["uri"] == uri]

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """Airflow's record of every task instance of the run (mapped ones each), hostname and pid included."""
        data = self.api(TRIGGER_USER, "GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances",
                        params={"limit": 1000})
        return list(data["task_instances"])

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        data = self.api(TRIGGER_USER, "GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")
        return {ti["task_id"]: ti["state"] or "none" for ti in data["task_instances"]}

    def run_state(self, dag_id: str, run_id: str) -> str:
        return str(self.api(TRIGGER_USER, "GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"])

    def answer_approval(self, dag_id: str, run_id: str, task_id: str, *, user: str, choice: str,
                        comment: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Answer a human-in-the-loop request as ``user``: ``choice``, the ``comment`` and the form's other fields
        (``params``, e.g. ``accept``)."""
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/-1/hitlDetails"
        detail = self.api(user, "GET", path)
        log.info("approval request shown to %s: %s", user, detail.get("subject"))
        return self.api(user, "PATCH", path, json={"chosen_options": [choice],
                                                    "params_input": {**(params or {}), "comment": comment}})

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
