"""Stopping the local Airflow leaves none of its processes behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from promshift.local_airflow import LocalAirflow

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
