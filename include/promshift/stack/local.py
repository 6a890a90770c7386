"""The local stack: the simulated fleet, the source Prometheus and the AMP stand-in, all on 127.0.0.1.

``LocalStack.up()`` starts (or reuses) three long-lived processes, each in its own
session so they outlive the command that started them:

- ``fleet``: ``python -m promshift.stack.fleet`` (one scrape target per node);
- ``source``: the self-hosted Prometheus scraping the fleet through file_sd;
- ``target``: a second Prometheus with the remote-write receiver under a
  workspace-like route prefix, standing in for the AMP workspace.

Everything lives under ``StackConfig.home``: ``<name>.pid``, ``<name>.log``,
``stack.json`` (what is running), ``source/`` and ``target/`` (configs and TSDBs).
The source's ``prometheus.yml`` is written only when missing, because deployers
edit it later (one ``remote_write`` entry per metric group).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests
import yaml

import promshift
from promshift.stack.fleet import FleetSpec, write_file_sd

logger = logging.getLogger(__name__)

PROMETHEUS_BIN = "/usr/bin/prometheus"
FLEET, TARGET, SOURCE = "fleet", "target", "source"
# Start order: the fleet before the source that scrapes it, the target before the source that
# may remote-write to it. Stop order is the reverse, so the source can flush its queues.
COMPONENTS = (FLEET, TARGET, SOURCE)
EXTERNAL_LABELS = {"cluster": "local-gpu-fleet", "prometheus_replica": "source-0"}
SCRAPE_JOB = "dcgm"
SOURCE_RETENTION = "2d"  # the source's --storage.tsdb.retention.time
LOG_TAIL_LINES = 30


class StackError(RuntimeError):
    """The local stack could not be brought to the requested state."""


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None


@dataclass(frozen=True)
class StackConfig:
    """Where the local stack keeps its state and which ports it listens on."""

    home: Path = field(default_factory=lambda: Path.cwd() / ".state")
    nodes: int = 200
    fleet_port: int = 9400
    source_port: int = 9090
    target_port: int = 9091
    scrape_interval: str = "5s"
    target_prefix: str = "/workspaces/ws-local"
    seed: int = 0
    prometheus_bin: str = PROMETHEUS_BIN

    def __post_init__(self) -> None:
        # Prometheus runs with cwd=home but reads absolute paths from its config: resolve once here.
        object.__setattr__(self, "home", Path(self.home).expanduser().resolve())
        prefix = "/" + self.target_prefix.strip("/")
        object.__setattr__(self, "target_prefix", prefix)
        if self.nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {self.nodes}")
        ports = (self.fleet_port, self.source_port, self.target_port)
        if len(set(ports)) != len(ports):
            raise ValueError(f"fleet, source and target ports must differ, got {ports}")

    @classmethod
    def from_env(cls, **overrides: Any) -> StackConfig:
        """Defaults, then ``PROMSHIFT_*`` environment variables, then non-None ``overrides``."""
        values: dict[str, Any] = {
            "home": Path(os.environ.get("PROMSHIFT_HOME") or Path.cwd() / ".state"),
            "nodes": _env_int("PROMSHIFT_NODES", cls.nodes),
            "fleet_port": _env_int("PROMSHIFT_FLEET_PORT", cls.fleet_port),
            "source_port": _env_int("PROMSHIFT_SOURCE_PORT", cls.source_port),
            "target_port": _env_int("PROMSHIFT_TARGET_PORT", cls.target_port),
        }
        values.update({key: value for key, value in overrides.items() if value is not None})
        return cls(**values)


@dataclass(frozen=True)
class _Component:
    """One process of the stack and how to recognise and probe it."""

    name: str
    port: int
    argv: tuple[str, ...]
    url: str
    health_url: str
    # A command-line fragment that marks the process as this stack's, so a recycled PID in a
    # stale pid file is never signalled.
    marker: str
    port_env: str


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name in field 2 may contain spaces and parentheses; the state follows the last ")".
    return stat.rsplit(")", 1)[1].split()[0]


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


# Popen objects of processes this interpreter started: polling them reaps exited children
# (a zombie still "exists" for kill(pid, 0)) and avoids "still running" ResourceWarnings.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def _alive(pid: int) -> bool:
    child = _CHILDREN.get(pid)
    if child is not None:
        if child.poll() is None:
            return True
        del _CHILDREN[pid]
        return False
    state = _proc_state(pid)
    return state is not None and state not in ("Z", "X")


def _signal_group(pid: int, sig: int) -> None:
    """Signal the process group the component leads (start_new_session made pgid == pid)."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def find_free_ports(count: int = 1) -> list[int]:
    """Ports free on 127.0.0.1 right now; all sockets are held together so the ports differ."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # Same option the servers use, so sockets lingering in TIME_WAIT do not count as taken.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def _tail(path: Path, offset: int = 0, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            text = handle.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


class LocalStack:
    """Start, reuse, inspect and stop the local fleet + source + target processes."""

    def __init__(self, config: StackConfig | None = None) -> None:
        self.config = config or StackConfig.from_env()
        self._http = requests.Session()
        # Local endpoints only: an HTTP(S)_PROXY from the environment must not intercept them.
        self._http.trust_env = False
        self._log_offsets: dict[str, int] = {}

    # -- addresses and paths -------------------------------------------------------------

    @property
    def home(self) -> Path:
        """State directory of this stack."""
        return self.config.home

    @property
    def fleet(self) -> FleetSpec:
        """The fleet this stack simulates."""
        return FleetSpec(nodes=self.config.nodes, seed=self.config.seed)

    @property
    def fleet_url(self) -> str:
        """Base URL of the fleet simulator."""
        return f"http://127.0.0.1:{self.config.fleet_port}"

    @property
    def source_url(self) -> str:
        """Base URL of the source Prometheus."""
        return f"http://127.0.0.1:{self.config.source_port}"

    @property
    def target_url(self) -> str:
        """Base URL of the AMP stand-in; its HTTP API lives under it, as under an AMP workspace URL."""
        return f"http://127.0.0.1:{self.config.target_port}{self.config.target_prefix}"

    @property
    def target_remote_write_url(self) -> str:
        """Where the source remote-writes to reach the target."""
        return f"{self.target_url}/api/v1/write"

    @property
    def source_config_path(self) -> Path:
        """The source Prometheus config (deployers add ``remote_write`` entries here)."""
        return self.home / SOURCE / "prometheus.yml"

    @property
    def target_config_path(self) -> Path:
        """The target Prometheus config (no scrape jobs)."""
        return self.home / TARGET / "prometheus.yml"

    @property
    def file_sd_path(self) -> Path:
        """The file_sd JSON listing one target per fleet node."""
        return self.home / SOURCE / "targets" / f"{SCRAPE_JOB}.json"

    @property
    def state_path(self) -> Path:
        """JSON record of what the stack last started."""
        return self.home / "stack.json"

    def data_dir(self, name: str) -> Path:
        """TSDB directory (``--storage.tsdb.path``) of the ``source`` or the ``target``."""
        if name not in (SOURCE, TARGET):
            raise ValueError(f"only the source and the target have a TSDB, not {name!r}")
        return self.home / name / "data"

    def log_path(self, name: str) -> Path:
        """Log file of component ``name``."""
        return self.home / f"{name}.log"

    def pid_path(self, name: str) -> Path:
        """PID file of component ``name``."""
        return self.home / f"{name}.pid"

    def _components(self) -> dict[str, _Component]:
        cfg = self.config
        fleet_argv = (
            sys.executable,
            "-m",
            "promshift.stack.fleet",
            "--nodes",
            str(cfg.nodes),
            "--port",
            str(cfg.fleet_port),
            "--seed",
            str(cfg.seed),
        )
        source_data, target_data = self.data_dir(SOURCE), self.data_dir(TARGET)
        source_argv = (
            cfg.prometheus_bin,
            f"--config.file={self.source_config_path}",
            f"--storage.tsdb.path={source_data}",
            f"--web.listen-address=127.0.0.1:{cfg.source_port}",
            "--web.enable-lifecycle",
            "--web.enable-admin-api",
            f"--storage.tsdb.retention.time={SOURCE_RETENTION}",
        )
        target_argv = (
            cfg.prometheus_bin,
            f"--config.file={self.target_config_path}",
            f"--storage.tsdb.path={target_data}",
            f"--web.listen-address=127.0.0.1:{cfg.target_port}",
            "--web.enable-remote-write-receiver",
            "--web.enable-admin-api",
            f"--web.route-prefix={cfg.target_prefix}",
            f"--web.external-url={self.target_url}",
        )
        return {
            FLEET: _Component(
                FLEET,
                cfg.fleet_port,
                fleet_argv,
                self.fleet_url,
                f"{self.fleet_url}/healthz",
                "promshift.stack.fleet",
                "PROMSHIFT_FLEET_PORT",
            ),
            TARGET: _Component(
                TARGET,
                cfg.target_port,
                target_argv,
                self.target_url,
                f"{self.target_url}/-/ready",
                f"--storage.tsdb.path={target_data}",
                "PROMSHIFT_TARGET_PORT",
            ),
            SOURCE: _Component(
                SOURCE,
                cfg.source_port,
                source_argv,
                self.source_url,
                f"{self.source_url}/-/ready",
                f"--storage.tsdb.path={source_data}",
                "PROMSHIFT_SOURCE_PORT",
            ),
        }

    # -- public operations ---------------------------------------------------------------

    def up(self, timeout: float = 180.0) -> dict[str, dict[str, Any]]:
        """Start whatever is not already running and healthy; return when the source has scraped every node.

        Raises StackError when Prometheus is not installed, a port is taken by another
        process, a process dies during start-up, or the deadline passes.
        """
        self._require_prometheus()
        deadline = time.monotonic() + timeout
        components = self._components()
        with self._locked():
            self._write_configs()
            plans = {name: self._plan(component) for name, component in components.items()}
            # Check every port before starting anything, so a conflict leaves nothing half-started.
            for name, (action, _pid) in plans.items():
                if action == "start":
                    self._require_port(components[name])
            if plans[FLEET][0] == "restart":
                logger.info(
                    "fleet changes from %s to %s nodes",
                    self._read_state().get("fleet", {}).get("nodes", "?"),
                    self.config.nodes,
                )
            self._apply(components[FLEET], plans[FLEET])
            self._wait_healthy([components[FLEET]], deadline)
            # Written only once the fleet answers, so the source never scrapes nodes it does not serve.
            write_file_sd(self.fleet, self.config.fleet_port, self.file_sd_path)
            for name in (TARGET, SOURCE):
                self._apply(components[name], plans[name])
            self._wait_healthy([components[TARGET], components[SOURCE]], deadline)
            self._write_state(components)
            self._wait_scraped(deadline)
        return self.status()

    def down(self, timeout: float = 30.0) -> None:
        """Stop every component (SIGTERM, then SIGKILL after ``timeout`` s); idempotent."""
        if not self.home.exists():
            return
        with self._locked():
            self._down(timeout)

    def status(self) -> dict[str, dict[str, Any]]:
        """Per component: ``pid``, ``alive``, ``healthy`` and ``url``."""
        result: dict[str, dict[str, Any]] = {}
        for name, component in self._components().items():
            pid = self._read_pid(name)
            alive = pid is not None and self._owns(pid, component)
            result[name] = {
                "pid": pid,
                "alive": alive,
                "healthy": alive and self._healthy(component),
                "url": component.url,
            }
        return result

    def reset(self) -> None:
        """Stop the stack and delete its state (configs, TSDBs, logs) for a fresh start.

        Only what the stack itself creates is removed, so a mistyped PROMSHIFT_HOME cannot
        wipe unrelated files.
        """
        if not self.home.exists():
            return
        with self._locked():
            self._down(30.0)
            for name in (SOURCE, TARGET):
                shutil.rmtree(self.home / name, ignore_errors=True)
            for name in COMPONENTS:
                self.log_path(name).unlink(missing_ok=True)
                self.pid_path(name).unlink(missing_ok=True)
            self.state_path.unlink(missing_ok=True)
        # stack.lock stays: deleting it could let a waiting process and a new one both "hold" the lock.
        logger.info("local stack state under %s removed", self.home)

    # -- process management --------------------------------------------------------------

    @property
    def _lock_path(self) -> Path:
        return self.home / "stack.lock"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Serialise up/down/reset across processes (CLI, tests and DAG tasks may race)."""
        self.home.mkdir(parents=True, exist_ok=True)
        with self._lock_path.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _require_prometheus(self) -> None:
        binary = self.config.prometheus_bin
        if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
            raise StackError(
                f"Prometheus is not installed ({binary} not found); install it with "
                "`apt-get install -y prometheus`"
            )

    def _read_pid(self, name: str) -> int | None:
        try:
            return int(self.pid_path(name).read_text().strip())
        except (OSError, ValueError):
            return None

    def _owns(self, pid: int, component: _Component) -> bool:
        return _alive(pid) and component.marker in " ".join(_cmdline(pid))

    def _healthy(self, component: _Component) -> bool:
        try:
            return self._http.get(component.health_url, timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def _plan(self, component: _Component) -> tuple[str, int | None]:
        """Decide between ``reuse``, ``restart`` (ours, other settings) and ``start`` for a component."""
        pid = self._read_pid(component.name)
        if pid is None or not _alive(pid):
            return "start", None
        cmdline = _cmdline(pid)
        # argv[0] is skipped: another interpreter path (venv vs. Airflow worker) is the same fleet.
        if cmdline[1:] == list(component.argv[1:]):
            return "reuse", pid
        if component.marker in " ".join(cmdline):
            return "restart", pid
        logger.warning(
            "%s names pid %s, which is not ours (%s); ignoring it",
            self.pid_path(component.name),
            pid,
            " ".join(cmdline)[:120],
        )
        return "start", None

    def _apply(self, component: _Component, plan: tuple[str, int | None]) -> None:
        action, pid = plan
        if action == "reuse":
            logger.info("%s already running (pid %s), reusing it", component.name, pid)
            return
        if action == "restart" and pid is not None:
            logger.info("%s (pid %s) runs with other settings; restarting it", component.name, pid)
            self._stop({component.name: pid}, 30.0)
        self.pid_path(component.name).unlink(missing_ok=True)
        self._require_port(component)
        self._start(component)

    @staticmethod
    def _require_port(component: _Component) -> None:
        if not _port_free(component.port):
            raise StackError(
                f"port {component.port} on 127.0.0.1 (for the {component.name}) is already in use by "
                f"another process; stop it or choose another port with {component.port_env}"
            )

    def _start(self, component: _Component) -> None:
        log_path = self.log_path(component.name)
        env = dict(os.environ)
        package_root = str(Path(promshift.__file__).resolve().parent.parent)
        # The fleet runs as `python -m promshift.stack.fleet`: make sure it imports this very package.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        with log_path.open("ab") as log:
            log.write(f"--- {datetime.now(UTC).isoformat()} starting: {' '.join(component.argv)}\n".encode())
            log.flush()
            self._log_offsets[component.name] = log.tell()
            proc = subprocess.Popen(
                component.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.home,
                env=env,
                start_new_session=True,
            )
        _CHILDREN[proc.pid] = proc
        self.pid_path(component.name).write_text(f"{proc.pid}\n")
        logger.info("started %s (pid %s), log %s", component.name, proc.pid, log_path)

    def _wait_healthy(self, components: list[_Component], deadline: float) -> None:
        pending = {c.name: c for c in components}
        while pending:
            for name, component in list(pending.items()):
                pid = self._read_pid(name)
                if pid is None or not _alive(pid):
                    raise StackError(
                        f"{name} exited during start-up; last lines of {self.log_path(name)}:\n"
                        f"{_tail(self.log_path(name), self._log_offsets.get(name, 0))}"
                    )
                if self._healthy(component):
                    logger.info("%s is healthy at %s", name, component.url)
                    del pending[name]
            if not pending:
                return
            if time.monotonic() > deadline:
                tails = "\n".join(
                    f"--- {self.log_path(n)}:\n{_tail(self.log_path(n), self._log_offsets.get(n, 0))}"
                    for n in pending
                )
                raise StackError(f"not healthy before the deadline: {', '.join(pending)}\n{tails}")
            time.sleep(0.2)

    def _scraped_targets(self) -> int:
        query = f'count(up{{job="{SCRAPE_JOB}"}} == 1)'
        try:
            response = self._http.get(f"{self.source_url}/api/v1/query", params={"query": query}, timeout=5)
            response.raise_for_status()
            result = response.json()["data"]["result"]
        except (requests.RequestException, ValueError, KeyError) as exc:
            logger.debug("querying the source for scraped targets failed: %s", exc)
            return 0
        return int(float(result[0]["value"][1])) if result else 0

    def _wait_scraped(self, deadline: float) -> None:
        expected = self.config.nodes
        last, logged_at = -1, 0.0
        while True:
            scraped = self._scraped_targets()
            # At most one progress line every 2 s: a 2,000-node fleet fills in over a whole interval.
            if scraped != last and (scraped == expected or time.monotonic() - logged_at >= 2.0):
                logger.info("source sees %s/%s fleet targets up", scraped, expected)
                last, logged_at = scraped, time.monotonic()
            if scraped == expected:
                return
            if time.monotonic() > deadline:
                raise StackError(
                    f"the source scraped {scraped} of {expected} fleet targets before the deadline; "
                    f"see {self.source_url}/targets and {self.log_path(FLEET)}"
                )
            time.sleep(0.5)

    def _down(self, timeout: float) -> None:
        components = self._components()
        running = {
            name: pid
            for name in COMPONENTS
            if (pid := self._read_pid(name)) is not None and self._owns(pid, components[name])
        }
        # The source first: it may be flushing remote-write queues into the target.
        if SOURCE in running:
            self._stop({SOURCE: running.pop(SOURCE)}, timeout)
        self._stop(running, timeout)
        for name in COMPONENTS:
            self.pid_path(name).unlink(missing_ok=True)

    def _stop(self, pids: dict[str, int], timeout: float) -> None:
        for name, pid in pids.items():
            logger.info("stopping %s (pid %s)", name, pid)
            _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while any(_alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        for name, pid in pids.items():
            if _alive(pid):
                logger.warning("%s (pid %s) ignored SIGTERM for %ss; killing it", name, pid, timeout)
                _signal_group(pid, signal.SIGKILL)
        kill_deadline = time.monotonic() + 5.0
        while any(_alive(pid) for pid in pids.values()) and time.monotonic() < kill_deadline:
            time.sleep(0.05)

    # -- files ---------------------------------------------------------------------------

    def _write_configs(self) -> None:
        cfg = self.config
        source = {
            "global": {
                "scrape_interval": cfg.scrape_interval,
                "evaluation_interval": cfg.scrape_interval,
                "external_labels": dict(EXTERNAL_LABELS),
            },
            "scrape_configs": [
                {"job_name": SCRAPE_JOB, "file_sd_configs": [{"files": [str(self.file_sd_path)]}]},
            ],
        }
        target = {"global": {"evaluation_interval": "1m"}, "scrape_configs": []}
        self._write_once(
            self.source_config_path,
            "# Source Prometheus of promshift's local stack. Written once; deployers add remote_write.\n",
            source,
        )
        self._write_once(
            self.target_config_path,
            "# Stand-in for the AMP workspace: receives remote write, scrapes nothing.\n",
            target,
        )
        for name in (SOURCE, TARGET):
            self.data_dir(name).mkdir(parents=True, exist_ok=True)

    @staticmethod
    def _write_once(path: Path, header: str, document: dict[str, Any]) -> None:
        if path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(header + yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
        os.replace(tmp, path)
        logger.info("wrote %s", path)

    def _read_state(self) -> dict[str, Any]:
        try:
            state = json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return {}
        return state if isinstance(state, dict) else {}

    def _write_state(self, components: dict[str, _Component]) -> None:
        cfg = self.config
        state = {
            "updated_at": datetime.now(UTC).isoformat(),
            "fleet": {"nodes": cfg.nodes, "seed": cfg.seed, "port": cfg.fleet_port, "url": self.fleet_url},
            "source": {"url": self.source_url, "config": str(self.source_config_path)},
            "target": {"url": self.target_url, "remote_write_url": self.target_remote_write_url},
            "scrape_interval": cfg.scrape_interval,
            "components": {
                name: {"pid": self._read_pid(name), "argv": list(component.argv)}
                for name, component in components.items()
            },
        }
        tmp = self.state_path.with_name(".stack.json.tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        os.replace(tmp, self.state_path)
