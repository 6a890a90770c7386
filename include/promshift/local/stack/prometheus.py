"""One way to run a Prometheus server: its command line, and a server this process starts, owns and stops.

- ``prometheus_argv`` builds every Prometheus command line promshift runs: the local stack's
  long-lived source and target (``stack.local``, which keeps them in their own session behind pid
  files), the benchmarks' servers over backfilled TSDBs and the tests' throwaway servers;
- ``PrometheusProcess`` is a server owned by the process that starts it (a benchmark, a test):
  started on 127.0.0.1, waited for (``/-/ready``), measured (``rss_mb``), stopped (SIGTERM, then
  SIGKILL). A context manager: ``with PrometheusProcess(...) as prom: prom.url``.

The TSDB's history is written with ``stack.backfill`` (OpenMetrics text and ``promtool``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import requests

PROMETHEUS_BIN = "/usr/bin/prometheus"
PROMTOOL_BIN = "/usr/bin/promtool"


def prometheus_argv(config: Path | str, data_dir: Path | str, port: int, *flags: str,
                    binary: str = PROMETHEUS_BIN) -> tuple[str, ...]:
    """``prometheus --config.file --storage.tsdb.path --web.listen-address=127.0.0.1:<port> <flags...>``."""
    return (binary, f"--config.file={config}", f"--storage.tsdb.path={data_dir}",
            f"--web.listen-address=127.0.0.1:{port}", *flags)


def prometheus_installed(binary: str = PROMETHEUS_BIN) -> bool:
    return os.path.isfile(binary) and os.access(binary, os.X_OK)


class PrometheusStartError(RuntimeError):
    """The server exited during start-up or was not ready before the deadline (with its log's tail)."""


class PrometheusProcess:
    """A Prometheus on 127.0.0.1 that this process starts and stops (its own session, so a signal to the
    caller's group does not reach it, and ``stop`` ends it whatever happens to the caller's tests).

    ``config``: the config text to write to ``<directory>/<name>.yml``, or the path of an existing
    config file (it is not touched); ``data_dir`` defaults to ``<directory>/<name>``. ``flags`` follow the
    listen address on the command line. ``log``: where its output goes (``<directory>/<name>.log``;
    ``None`` discards it). ``env``: the server's environment (default: this process's, read at start).
    """

    def __init__(self, name: str, directory: Path, *, port: int, config: str | Path = "global: {}\n",
                 data_dir: Path | None = None, flags: Sequence[str] = (),
                 binary: str = PROMETHEUS_BIN, log: bool = True, env: Mapping[str, str] | None = None,
                 start: bool = True) -> None:
        self.name, self.port = name, port
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if isinstance(config, Path):
            self.config_path = config
        else:
            self.config_path = directory / f"{name}.yml"
            self.config_path.write_text(config)
        self.data_dir = data_dir or directory / name
        self.url = f"http://127.0.0.1:{port}"
        self.argv = prometheus_argv(self.config_path, self.data_dir, port, *flags, binary=binary)
        self.log_path: Path | None = directory / f"{name}.log" if log else None
        self._env = None if env is None else dict(env)
        self.proc: subprocess.Popen[bytes] | None = None
        self._http = requests.Session()
        self._http.trust_env = False  # 127.0.0.1 only: an HTTP(S)_PROXY from the environment must not intercept it
        if start:
            self.start()

    def start(self) -> PrometheusProcess:
        if self.proc is not None and self.proc.poll() is None:
            return self
        out = self.log_path.open("ab") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         env=self._env, start_new_session=True)
        finally:
            if self.log_path:
                out.close()  # type: ignore[union-attr]
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, chars: int = 2000) -> str:
        if self.log_path is None:
            return "(log discarded)"
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def ready(self) -> bool:
        """``/-/ready`` answers 200 (the TSDB is loaded and the server serves queries)."""
        try:
            return self._http.get(f"{self.url}/-/ready", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def wait_ready(self, deadline_s: float = 180.0) -> PrometheusProcess:
        until = time.monotonic() + deadline_s
        while time.monotonic() < until:
            if not self.alive():
                raise PrometheusStartError(f"{self.name} exited: {self.log_tail()}")
            if self.ready():
                return self
            time.sleep(0.2)
        raise PrometheusStartError(f"{self.name} not ready after {deadline_s:.0f}s: {self.log_tail()}")

    def rss_mb(self) -> float | None:
        """Its resident memory now (VmRSS), MB; None once it has exited."""
        if self.proc is None:
            return None
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
        except OSError:
            return None
        return None

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (it flushes its head), SIGKILL after ``timeout_s``; idempotent."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._http.close()

    def __enter__(self) -> PrometheusProcess:
        try:
            return self.start().wait_ready()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
