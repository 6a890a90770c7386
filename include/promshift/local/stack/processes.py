"""How the local stack runs its processes: pid files, logs, start, health, stop, and the stack's lock.

``StackProcesses`` is the base of every component family (``promshift.local.stack.parts``): each family
describes its processes as ``Component``s and this starts, probes and stops them alike. A family whose health
is not one HTTP answer, or which must clear a file before a start or pass variables to its process, overrides
``_healthy``, ``_before_start`` or ``_child_env`` for its own components and hands the rest to ``super()``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests
import yaml

import promshift
from promshift.local.stack.spec import LOG_TAIL_LINES, Component, StackConfig, StackError

logger = logging.getLogger(__name__)


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


class StackProcesses:
    """Start, reuse, probe and stop the processes of a stack whose state lives under ``config.home``."""

    def __init__(self, config: StackConfig | None = None) -> None:
        self.config = config or StackConfig.from_env()
        self._http = requests.Session()
        # Local endpoints only: an HTTP(S)_PROXY from the environment must not intercept them.
        self._http.trust_env = False
        self._log_offsets: dict[str, int] = {}

    @property
    def home(self) -> Path:
        """State directory of this stack."""
        return self.config.home

    @property
    def state_path(self) -> Path:
        """JSON record of what the stack last started."""
        return self.home / "stack.json"

    def log_path(self, name: str) -> Path:
        """Log file of component ``name``."""
        return self.home / f"{name}.log"

    def pid_path(self, name: str) -> Path:
        """PID file of component ``name``."""
        return self.home / f"{name}.pid"

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

    def _read_pid(self, name: str) -> int | None:
        try:
            return int(self.pid_path(name).read_text().strip())
        except (OSError, ValueError):
            return None

    def _owns(self, pid: int, component: Component) -> bool:
        return _alive(pid) and component.marker in " ".join(_cmdline(pid))

    def _components(self) -> dict[str, Component]:
        """Every component of the stack, by name (the composition, ``LocalStack``, says which)."""
        raise NotImplementedError

    def _healthy(self, component: Component) -> bool:
        """Whether ``component`` answers its health URL (a family with another notion overrides it for its own)."""
        try:
            return self._http.get(component.health_url, timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def _before_start(self, component: Component) -> None:
        """Clear what a dead process of ``component`` left that could pass for the new one's (none by default)."""

    def _child_env(self, component: Component) -> dict[str, str]:
        """Variables ``component``'s process gets beyond the environment (none by default)."""
        return {}

    def _plan(self, component: Component) -> tuple[str, int | None]:
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

    def _apply(self, component: Component, plan: tuple[str, int | None]) -> None:
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
    def _require_port(component: Component) -> None:
        if component.port == 0:  # the process binds any free port itself
            return
        if not _port_free(component.port):
            raise StackError(
                f"port {component.port} on 127.0.0.1 (for the {component.name}) is already in use by "
                f"another process; stop it or choose another port with {component.port_env}"
            )

    def _start(self, component: Component) -> None:
        log_path = self.log_path(component.name)
        self._before_start(component)
        env = dict(os.environ)
        package_root = str(Path(promshift.__file__).resolve().parent.parent)
        # The fleet runs as `python -m promshift.local.stack.fleet`: make sure it imports this very package.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self._child_env(component))
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

    def _wait_healthy(self, components: list[Component], deadline: float) -> None:
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
