"""``stack down`` stops the Airflow a demo left running (its process group, by the pid file), and nothing else."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from promshift.local.stack.local import AIRFLOW, LocalStack, StackConfig

SLEEPER = "import time, sys; time.sleep(120)"


def spawn(*args: str) -> subprocess.Popen[bytes]:
    """A process group leader whose command line carries ``args`` (``airflow standalone``, or not)."""
    return subprocess.Popen([sys.executable, "-c", SLEEPER, *args], start_new_session=True)


def gone(proc: subprocess.Popen[bytes], within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LocalStack:
    monkeypatch.setenv("PROMSHIFT_HOME", str(tmp_path / "state"))
    (tmp_path / "state").mkdir()
    return LocalStack(StackConfig.from_env())


def test_down_stops_the_airflow_of_the_pid_file(stack: LocalStack) -> None:
    airflow = spawn("airflow", "standalone")
    try:
        stack.pid_path(AIRFLOW).write_text(f"{airflow.pid}\n")
        stack.down()
        assert gone(airflow), "stack down left airflow standalone running"
        assert not stack.pid_path(AIRFLOW).exists()
    finally:
        airflow.kill()
        airflow.wait()


def test_a_recycled_pid_that_is_not_airflow_is_never_signalled(stack: LocalStack) -> None:
    bystander = spawn("something-else")
    try:
        stack.pid_path(AIRFLOW).write_text(f"{bystander.pid}\n")
        stack.down()
        assert bystander.poll() is None, "stack down signalled a process that is not airflow standalone"
        assert not stack.pid_path(AIRFLOW).exists()  # the stale file is gone
    finally:
        bystander.kill()
        bystander.wait()


def test_down_stops_every_member_of_a_celery_airflow_group_even_after_its_leader_exited(stack: LocalStack) -> None:
    """The celery executor's components share the API server's process group: a worker outliving the API
    server must still be stopped, and a process of another group left alone."""
    # As LocalAirflow starts them: the leader's own group in this session, the others joining it.
    leader = subprocess.Popen([sys.executable, "-c", SLEEPER, "airflow", "api-server"], process_group=0)
    members = [subprocess.Popen([sys.executable, "-c", SLEEPER, "airflow", role], process_group=leader.pid)
               for role in ("scheduler", "celery", "worker")]
    outsider = spawn("airflow", "standalone")  # someone else's Airflow, in a group of its own
    try:
        stack.pid_path(AIRFLOW).write_text(f"{leader.pid}\n")
        leader.kill()
        leader.wait()
        stack.down()
        assert all(gone(m) for m in members), "stack down left a member of Airflow's process group running"
        assert outsider.poll() is None, "stack down stopped an Airflow of another process group"
        assert not stack.pid_path(AIRFLOW).exists()
    finally:
        for proc in (*members, outsider):
            proc.kill()
            proc.wait()
