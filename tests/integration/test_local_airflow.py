"""Stopping the local Airflow leaves none of its processes behind; its REST calls survive a slow API server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
import requests

from promshift.local.airflow_lab import LocalAirflow

# A stand-in for a scheduler busy shutting down (or a waiting task): it ignores SIGTERM.
CHILD = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
    "time.sleep(600)\n"
)
# A stand-in for `airflow standalone`: the leader exits on SIGTERM, leaving its child behind.
LEADER = (
    "import subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]])\n"
    "time.sleep(600)\n"
)


def alive(pid: int) -> bool:
    """Running, not a zombie (a zombie whose parent is gone is reaped by init)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def test_stop_kills_the_whole_process_group_even_after_the_leader_exits(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    leader = subprocess.Popen([sys.executable, "-c", LEADER, CHILD, str(pid_file)], start_new_session=True)
    deadline = time.time() + 10
    while not (pid_file.exists() and pid_file.read_text()) and time.time() < deadline:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    assert alive(child) and os.getpgid(child) == leader.pid
    airflow = LocalAirflow(home=tmp_path, port=1, extra_env={}, proc=leader)
    started = time.monotonic()
    airflow.stop(term_wait_s=1.0, kill_wait_s=5.0)
    assert leader.poll() is not None
    deadline = time.time() + 5
    while alive(child) and time.time() < deadline:
        time.sleep(0.05)
    assert not alive(child), "the SIGTERM-ignoring child outlived stop()"
    assert time.monotonic() - started < 8


class _SlowFirstAnswers(BaseHTTPRequestHandler):
    """Airflow's API on a loaded machine: the first token request and the first GET miss the client's deadline."""

    calls: ClassVar[list[str]] = []

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self, body: dict[str, object]) -> None:
        first = self.calls.count(self.path) == 1
        if first and (self.command == "GET" or self.path == "/auth/token"):
            time.sleep(1.0)  # longer than the client waits
        data = json.dumps(body).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            pass  # the client gave up

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.calls.append(self.path)
        if self.path == "/api/v2/dags/d/dagRuns":
            time.sleep(1.0)  # a trigger that times out must not be sent twice
        self._answer({"access_token": "t"} if self.path == "/auth/token" else {"dag_run_id": "r"})

    def do_GET(self) -> None:  # noqa: N802
        self.calls.append(self.path)
        self._answer({"state": "success"})


def test_token_and_gets_are_retried_when_the_api_misses_a_deadline_but_a_post_is_not(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowFirstAnswers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        airflow = LocalAirflow(home=tmp_path, port=int(server.server_address[1]), extra_env={},
                               passwords={"sre-carol": "pw"}, request_timeout_s=0.3, retry_wait_s=0.05)
        assert airflow.run_state("d", "r") == "success"
        assert _SlowFirstAnswers.calls.count("/auth/token") >= 2  # the first token request timed out
        assert _SlowFirstAnswers.calls.count("/api/v2/dags/d/dagRuns/r") == 2  # so did the first GET
        with pytest.raises(requests.Timeout):
            airflow.api("sre-carol", "POST", "/dags/d/dagRuns", json={})
        assert _SlowFirstAnswers.calls.count("/api/v2/dags/d/dagRuns") == 1
    finally:
        server.shutdown()
        server.server_close()
