"""A source Prometheus on the file path switched to agent mode (forwarder only) and back, by restarting it.

``FileSourceModeSwitch`` is the switch (``core.ports.SourceModeSwitch``) over a ``ProcessControl``: the
source's running command line and a restart with another one. It restarts the source with an agent's
command line (``core.retire.agent_argv``) over the config's agent subset (``core.retire.agent_config``).

Which process control exists is the catch: promshift runs on Airflow workers, not on the source's host.
``PidFileControl`` (a process on this host, by its pid file) is the LAB's: its workers run beside the
source. A real file-path source has no process control from promshift: the same change is an edit of the
service's flags (Debian: ``ARGS=`` in ``/etc/default/prometheus``; systemd: a drop-in's ``ExecStart=``) and a
``systemctl restart prometheus`` by the host's owner (docs/lifecycle.md, "Retire the source"); the DAG then
finds the source already an agent (the mode is read first) and proves it. ``PopenControl`` is a process this
process started (tests, benchmarks).

Every switch is crash-safe: it reads the current mode first (``/-/ready`` says "Prometheus Agent" or
"Prometheus Server"), saves the server's config bytes, file mode and command line once (beside the config,
on the source's own host: ``.<config>.promshift-retire.json``) before any edit, derives the agent's from
that snapshot (never from a half-edited file), and on a failed start puts the server back. ``restore``
writes the saved bytes and command line back and checks both byte for byte.
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import requests

from promshift.adapters.deploy import write_keeping
from promshift.core.retire import agent_argv, agent_config


class ProcessControl(Protocol):
    """The source's process: its running command line, and a restart with another one (waits until ready)."""

    def argv(self) -> tuple[str, ...]: ...

    def restart(self, argv: Sequence[str]) -> None: ...


@dataclass(frozen=True)
class ModeChange:
    mode: str  # the mode after the call: "agent" or "server"
    changed: bool
    argv_before: tuple[str, ...]
    argv_after: tuple[str, ...]
    config_sha_before: str
    config_sha_after: str
    byte_identical: bool | None = None  # restore only: config bytes and command line equal the saved ones

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "changed": self.changed, "argv_before": list(self.argv_before),
                "argv_after": list(self.argv_after), "config_sha_before": self.config_sha_before,
                "config_sha_after": self.config_sha_after, "byte_identical": self.byte_identical}


class SourceModeError(RuntimeError):
    """The switch could not complete (one line; the server was put back when it could)."""


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()[:16]


def probe_mode(url: str, *, http: requests.Session | None = None, timeout_s: float = 5.0) -> str:
    """``agent``, ``server`` or ``down``, from the ``/-/ready`` answer's own words."""
    session = http or requests.Session()
    session.trust_env = False
    try:
        response = session.get(f"{url}/-/ready", timeout=timeout_s)
    except requests.RequestException:
        return "down"
    text = response.text[:200]
    if response.status_code != 200:
        return "down"
    return "agent" if "Agent" in text else "server" if "Server" in text else "down"


class FileSourceModeSwitch:
    """``mode``/``to_agent``/``restore`` on a source whose process the lab controls."""

    def __init__(self, *, url: str, config_path: Path, control: ProcessControl, agent_path: Path,
                 major_version: int = 2, log: Callable[[str], None] | None = None) -> None:
        self.url, self.config_path, self.control = url, Path(config_path), control
        self.agent_path, self.major_version = Path(agent_path), major_version
        self.snapshot_path = self.config_path.with_name(f".{self.config_path.name}.promshift-retire.json")
        self._log = log or (lambda _line: None)

    def mode(self) -> str:
        return probe_mode(self.url)

    def snapshot(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.snapshot_path.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and "config_b64" in data and "argv" in data else None

    def _save_snapshot(self) -> dict[str, Any]:
        existing = self.snapshot()
        if existing is not None:  # a crashed switch saved it: the server's, not the half-edited file's
            return existing
        data = self.config_path.read_bytes()
        snap = {"config_b64": base64.b64encode(data).decode(), "argv": list(self.control.argv()),
                "config_mode": self.config_path.stat().st_mode & 0o7777}
        tmp = self.snapshot_path.with_name(self.snapshot_path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(snap, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.snapshot_path)
        return snap

    def _argv_now(self) -> tuple[str, ...]:
        """The running command line; () when no process runs (a crash between stop and start)."""
        try:
            return tuple(self.control.argv())
        except SourceModeError:
            return ()

    def to_agent(self) -> ModeChange:
        current = self.mode()
        argv_now = self._argv_now()
        sha_now = _sha(self.config_path.read_bytes())
        if current == "agent":
            self._log("the source is already an agent: nothing to switch")
            return ModeChange("agent", False, argv_now, argv_now, sha_now, sha_now)
        if current != "server" and self.snapshot() is None:
            raise SourceModeError(f"the source at {self.url} does not answer /-/ready; not switching it")
        snap = self._save_snapshot()
        server_bytes, server_argv = base64.b64decode(snap["config_b64"]), tuple(snap["argv"])
        edited = agent_config(server_bytes)
        new_argv = agent_argv(server_argv, str(self.agent_path), major_version=self.major_version)
        self._log(f"source config: agent subset ({_sha(server_bytes)} -> {_sha(edited)}); restarting as an agent")
        write_keeping(self.config_path, edited)
        try:
            self.control.restart(new_argv)
            if self.mode() != "agent":
                raise SourceModeError("the restarted source does not say it is an agent")
        except Exception as exc:
            self._log(f"the agent did not start ({exc}); putting the server back")
            self._put_back(snap)
            raise SourceModeError(f"the source did not start as an agent ({str(exc).splitlines()[0][:200]}); "
                                  "the server was put back") from exc
        return ModeChange("agent", True, server_argv, new_argv, _sha(server_bytes), _sha(edited))

    def _put_back(self, snap: dict[str, Any]) -> tuple[bytes, tuple[str, ...]]:
        data, argv = base64.b64decode(snap["config_b64"]), tuple(snap["argv"])
        write_keeping(self.config_path, data, mode=int(snap.get("config_mode", 0o644)))
        self.control.restart(argv)
        return data, argv

    def restore(self) -> ModeChange:
        snap = self.snapshot()
        argv_now = self._argv_now()
        sha_now = _sha(self.config_path.read_bytes())
        if snap is None:
            if self.mode() == "server":
                self._log("no retire snapshot and the source is a server: nothing to undo")
                return ModeChange("server", False, argv_now, argv_now, sha_now, sha_now, None)
            raise SourceModeError("the source is not a server and no retire snapshot is saved beside "
                                  f"{self.config_path}; restore it by hand")
        data, argv = self._put_back(snap)
        deadline = time.monotonic() + 30
        while self.mode() != "server" and time.monotonic() < deadline:
            time.sleep(0.2)
        if self.mode() != "server":
            raise SourceModeError("the restored source does not say it is a server")
        identical = self.config_path.read_bytes() == data and tuple(self.control.argv()) == argv
        if identical:
            self.snapshot_path.unlink(missing_ok=True)
        return ModeChange("server", True, argv_now, tuple(self.control.argv()), sha_now,
                          _sha(self.config_path.read_bytes()), identical)


class PopenControl:
    """A Prometheus this process starts with a given command line (tests, benchmarks): ``restart`` stops
    it (SIGTERM: it flushes its queues) and starts the new command line, waiting for ``/-/ready``."""

    def __init__(self, argv: Sequence[str], *, url: str, log_path: Path, ready_s: float = 60.0) -> None:
        self.url, self.log_path, self.ready_s = url, Path(log_path), ready_s
        self._argv: tuple[str, ...] = tuple(argv)
        self.proc: Any = None

    def argv(self) -> tuple[str, ...]:
        return self._argv

    def start(self) -> None:
        import subprocess

        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self._argv, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.ready_s
        while probe_mode(self.url, timeout_s=1.0) == "down":
            if self.proc.poll() is not None:
                raise SourceModeError(f"prometheus exited: {self.log_path.read_text(errors='replace')[-300:]}")
            if time.monotonic() > deadline:
                raise SourceModeError(f"prometheus not ready after {self.ready_s:.0f}s")
            time.sleep(0.1)

    def stop(self) -> None:
        import subprocess

        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def restart(self, argv: Sequence[str]) -> None:
        self.stop()
        self._argv = tuple(argv)
        self.start()


def _environ(pid: int) -> dict[str, str]:
    """A running process's environment (``/proc/<pid>/environ``); empty when it cannot be read."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for part in raw.split(b"\0"):
        key, sep, value = part.decode(errors="replace").partition("=")
        if sep and key:
            out[key] = value
    return out


def _cmdline(pid: int) -> tuple[str, ...]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ()
    return tuple(part.decode(errors="replace") for part in raw.split(b"\0") if part)


class PidFileControl:
    """LAB ONLY: a Prometheus on this host, known by its pid file. ``restart`` writes the new command line to
    ``flags_file`` (the lab's ``/etc/default/prometheus``: the stack starts the source with it from then on),
    stops the process (SIGTERM: it flushes its remote-write queues; SIGKILL after 60 s), starts the new command
    line with the old process's environment (a service restart keeps the unit's) in its own session (output
    appended to ``log_path``), writes the pid file and waits for ``/-/ready``.
    Refuses a pid whose command line does not name ``config_path`` (a recycled pid is never signalled)."""

    def __init__(self, *, pid_file: Path, flags_file: Path, config_path: Path, url: str, log_path: Path,
                 cwd: Path | None = None, ready_s: float = 180.0) -> None:
        self.pid_file, self.flags_file, self.config_path = Path(pid_file), Path(flags_file), Path(config_path)
        self.url, self.log_path, self.cwd, self.ready_s = url, Path(log_path), cwd, ready_s

    def _pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if f"--config.file={self.config_path}" in _cmdline(pid) else None

    def argv(self) -> tuple[str, ...]:
        pid = self._pid()
        if pid is None:
            raise SourceModeError(f"no running source names {self.config_path} (pid file {self.pid_file})")
        return _cmdline(pid)

    def restart(self, argv: Sequence[str]) -> None:
        import signal
        import subprocess

        tmp = self.flags_file.with_name(self.flags_file.name + ".tmp")
        tmp.write_text(json.dumps(list(argv)))
        os.replace(tmp, self.flags_file)
        pid = self._pid()
        # The new process gets the old one's environment, as a service restart keeps the unit's (a sigv4
        # remote_write needs the AWS credentials the source was started with, which the caller may not have);
        # never written anywhere. With no process running, the caller's.
        env = _environ(pid) if pid is not None else None
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 60
            while _cmdline(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _cmdline(pid):
                os.kill(pid, signal.SIGKILL)
                while _cmdline(pid):
                    time.sleep(0.05)
        with self.log_path.open("ab") as log:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=self.cwd, start_new_session=True, env=env or None)
        self.pid_file.write_text(f"{proc.pid}\n")
        deadline = time.monotonic() + self.ready_s
        while probe_mode(self.url, timeout_s=1.0) == "down":
            if proc.poll() is not None:
                raise SourceModeError(f"the source exited at start: {self.log_path.read_text(errors='replace')[-300:]}")
            if time.monotonic() > deadline:
                raise SourceModeError(f"the source was not ready after {self.ready_s:.0f}s")
            time.sleep(0.1)


def mode_switch_from_extra(url: str, extra: Any) -> FileSourceModeSwitch:
    """The switch a source connection's ``extra.mode_switch`` names (LAB ONLY: a pid file on the worker's host);
    ValueError (one line) for anything else. Without it a file-path source has no process control: the caller
    refuses, naming the by-hand flags edit."""
    if not isinstance(extra, dict):
        raise ValueError("extra.mode_switch must be a mapping")
    need = ("pid_file", "flags_file", "config_path", "agent_path", "log_path")
    missing = [k for k in need if not isinstance(extra.get(k), str) or not extra.get(k)]
    if missing:
        raise ValueError(f"extra.mode_switch lacks {', '.join(missing)}")
    config = Path(extra["config_path"])
    control = PidFileControl(pid_file=Path(extra["pid_file"]), flags_file=Path(extra["flags_file"]),
                             config_path=config, url=url, log_path=Path(extra["log_path"]),
                             cwd=Path(extra["cwd"]) if extra.get("cwd") else None)
    return FileSourceModeSwitch(url=url, config_path=config, control=control, agent_path=Path(extra["agent_path"]),
                                major_version=int(extra.get("major_version", 2)))
