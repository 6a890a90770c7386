"""Shared by the end-to-end tests: a private PROMSHIFT_HOME and free ports for every component of the stack, and
the shared sessions (one stack and one Airflow for several scenarios).

Sessions and the scenarios that join them:

- ``spine_session`` (make test, marker ``spine``): happy with 24 h history on gpu-memory, drift on gpu-utilization,
  overlapping (test_demo_e2e.py).
- ``fleet_session`` (make e2e): the stack's second cluster, two AMP workspaces of the local AWS (each over its own
  target Prometheus), the fleet catalog (per-group connections), and ``SCENARIO=fleet``'s two waves of three
  groups (test_fleet_demo_e2e.py); its reports are
  ``runs["fleet:<group>"]``. It uses every group of its catalog: a scenario joining it brings a group of its own.

Scenarios with an Airflow of their own (``run_demo``, as ``make demo``): the AMP ones. Happy on AMP, k8s-cr and
lifecycle each need gpu-memory: lifecycle because only gpu-memory has rules on the source; happy and k8s-cr assert
latency SUCCESSFUL and were put on gpu-memory when gpu-utilization's latency was INCONCLUSIVE (its golden query
``count(DCGM_FI_DEV_GPU_UTIL == 0)`` answers no series on the simulated fleet, no GPU being idle). Latency is now
judged by the samples a query read (``stats=all``), and that query reads every GPU_UTIL series, so gpu-utilization's
latency is a real timing too; the wave-2 groups start only after gpu-utilization cut over. A group migrates once per
session (a group rolled back may migrate again: the retire scenario migrates every group not cut over). The retire
scenario (``make demo SCENARIO=retire``) runs on the k8s-cr path in the k8s-cr session (test_k8s_cr_demo_e2e.py,
after its happy and drift runs); on the file path in no e2e session (its DAGs: tests/integration/
test_retire_source.py). AMP bad-credentials:
Airflow's AWS secret is its environment's, and the scenario is that it is wrong.
k8s-cr also has the operator stand-in own the source config. Celery: another executor. plan-aggregate
(test_plan_aggregate_demo_e2e.py): its group exists only once the plan has read the stack's read load, and Airflow's
trigger form lists the catalog's groups when it parses the DAG, so the catalog must hold it before Airflow starts.
tests/board/test_board_airflow.py has its own Airflow with users and a history of its own. git (test_git_demo_e2e.py): a
session of its own (a stack with the git component, whose reconciler owns the source config) for happy and drift,
one after the other.

Profiles: the fleet, git, AMP and Celery scenarios run with ``demo-quick`` (``demo`` with a 1-minute warm-up and
30 s/1 min latency windows: a minute less per run, each check still with data: parity's golden layer compared
2,208 points on the git happy run). plan-aggregate keeps ``demo``: its fleet-view panels are compared at a 30 s step
and need 3 points, which one minute of dual-write does not hold (INCONCLUSIVE, measured). k8s-cr and lifecycle keep
``demo`` too (not tried with ``demo-quick``: their moved alert has ``for: 1m`` and must fire during dual-write).
"""

from __future__ import annotations

import io
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from promshift.core.deploy_kinds import REMOTE_WRITE
from promshift.local.demo import QUICK_PROFILE, DemoSession, run_scenario, start_session
from promshift.local.stack.local import LocalStack, StackConfig, find_free_ports

# Every port the stack may listen on (the last four only with --target amp).
PORT_VARS = ("FLEET", "SOURCE", "TARGET", "AWS", "MOTO", "FRONTDOOR", "RELAY")


def free_port() -> int:
    return find_free_ports(1)[0]


# How long a stopped test stack's processes get between SIGTERM and SIGKILL. Airflow standalone's triggerer and
# API server ignored SIGTERM for the stack's default 30 s at every session's end (measured 2026-12-06: "ignored
# SIGTERM for 30.0s", then killed): half a minute per session spent waiting on a test's throwaway state.
STOP_WAIT_S = 8.0


def stop_stack(timeout_s: float = STOP_WAIT_S) -> None:
    """Stop the stack the demo left running (PROMSHIFT_HOME and the ports come from the environment); what has not
    exited ``timeout_s`` after SIGTERM is killed (the stack's and Airflow's state are the test's, thrown away)."""
    LocalStack(StackConfig.from_env()).down(timeout=timeout_s)


@pytest.fixture
def small_stack_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PROMSHIFT_HOME", str(tmp_path / "state"))
    for name, port in zip(PORT_VARS, find_free_ports(len(PORT_VARS)), strict=True):
        monkeypatch.setenv(f"PROMSHIFT_{name}_PORT", str(port))
    return tmp_path


# -- shared sessions: one stack and one Airflow for several scenarios ------------------------------------------
# "A new scenario joins a shared e2e session; it does not start its own Airflow." A session's scenarios run one
# after another (two runs on one source config would clobber each other's snapshot and restore), each on a group
# of its own, and each when its test first asks for it, so the test reads the stack right after its scenario.
# The fixtures are module-scoped: make test/make e2e distribute tests by file (pytest-xdist --dist loadfile),
# so one module is one worker; the session's stack and Airflow stop when its module is done.


# What a test reads from the running stack right after its scenario.
Reader = Callable[[LocalStack], dict[str, Any]]


@dataclass
class ScenarioRun:
    report: dict[str, Any]
    out: Path
    printed: str  # what the scenario printed and logged
    source_config: str  # the source config file right after the run
    read: dict[str, Any]  # what the test asked to read from the running stack right after the run


@contextmanager
def captured_output() -> Iterator[io.StringIO]:
    """What the code under it prints (stdout, stderr) and logs (INFO and up), as the demo's user would see it."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        with redirect_stdout(buffer), redirect_stderr(buffer):
            yield buffer
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


class SharedSession:
    """A running ``DemoSession`` and the scenarios run in it so far (each once, by name)."""

    def __init__(self, tmp: Path, session: DemoSession, printed: str = "") -> None:
        self.tmp = tmp
        self.home = tmp / "state"
        self.session = session
        self.printed = printed  # what starting the session printed and logged
        self.runs: dict[str, ScenarioRun | BaseException] = {}
        self._background: dict[str, threading.Thread] = {}

    @property
    def stack(self) -> LocalStack:
        return self.session.stack

    def _run(self, name: str, group: str, scenario: str, deploy: str, read: Reader | None, timeout_s: float | None,
             printed: io.StringIO) -> None:
        out = run_scenario(self.session, group_name=group, scenario=scenario, deploy=deploy,
                           report_root=self.tmp / "reports", timeout_s=timeout_s)
        source_config = self.stack.source_config_path.read_text()
        extra = read(self.stack) if read else {}
        self.runs[name] = ScenarioRun(json.loads((out / "report.json").read_text()), out, printed.getvalue(),
                                      source_config, extra)

    def start(self, name: str, *, group: str, scenario: str, deploy: str = REMOTE_WRITE,
              read: Reader | None = None, timeout_s: float | None = None) -> None:
        """Run scenario ``name`` in a thread (``run(name)`` waits for it). Its ``printed`` is its thread's log only:
        stdout is one for the whole process. Runs overlapping on one source must not snapshot and restore its
        config across each other: start one only once the runs before it have deployed (``wait_deployed``). Nor may
        they want different connections (a deploy kind, the lifecycle's rules and dashboards): Airflow's connections
        are one set, read by each task when it runs."""

        def body() -> None:
            printed = io.StringIO()
            handler = logging.StreamHandler(printed)
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            handler.addFilter(lambda record: record.thread == threading.get_ident())
            logging.getLogger().addHandler(handler)
            try:
                self._run(name, group, scenario, deploy, read, timeout_s, printed)
            except BaseException as exc:  # noqa: BLE001 - kept for run(name), which raises it
                self.runs[name] = exc
            finally:
                logging.getLogger().removeHandler(handler)

        if logging.getLogger().level > logging.INFO or logging.getLogger().level == logging.NOTSET:
            logging.getLogger().setLevel(logging.INFO)
        thread = threading.Thread(target=body, name=f"scenario-{name}", daemon=True)
        self._background[name] = thread
        thread.start()

    def join(self) -> None:
        """Wait for every scenario started in the background."""
        for thread in self._background.values():
            thread.join()

    def wait_deployed(self, name: str, group: str, *, timeout_s: float = 900.0) -> None:
        """Until scenario ``name``'s dual-write entry for ``group`` is in the source config (or the run ended)."""
        entry, deadline = f"promshift-{group}", time.time() + timeout_s
        while self._background[name].is_alive() and time.time() < deadline:
            if entry in self.stack.source_config_path.read_text():
                return
            time.sleep(2)

    def run(self, name: str, *, group: str = "", scenario: str = "", deploy: str = REMOTE_WRITE,
            read: Reader | None = None, timeout_s: float | None = None) -> ScenarioRun:
        """Run scenario ``name`` (once; a failure is raised again to every later ask) and return its outcome; for
        one started in the background (``start``), wait for it."""
        if name in self._background:
            self._background[name].join()
        elif name not in self.runs:
            try:
                with captured_output() as printed:
                    self._run(name, group, scenario, deploy, read, timeout_s, printed)
            except BaseException as exc:
                self.runs[name] = exc
                raise
        found = self.runs[name]
        if isinstance(found, BaseException):
            raise RuntimeError(f"scenario {name!r} of this session failed earlier: {found!r}") from found
        return found


@contextmanager
def shared_session(tmp: Path, *, env: dict[str, str], unset: tuple[str, ...] = (),
                   **start: Any) -> Iterator[SharedSession]:
    """A fresh stack and one Airflow under ``tmp/state`` on free ports (``start_session(**start)``), stopped
    at the end; ``env`` is set (and ``unset`` removed) in this process's environment meanwhile."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PROMSHIFT_HOME", str(tmp / "state"))
        for name, port in zip(PORT_VARS, find_free_ports(len(PORT_VARS)), strict=True):
            mp.setenv(f"PROMSHIFT_{name}_PORT", str(port))
        for name in unset:
            mp.delenv(name, raising=False)
        for name, value in env.items():
            mp.setenv(name, value)
        try:
            with captured_output() as printed:
                session = start_session(airflow_port=free_port(), **start)
            yield SharedSession(tmp, session, printed.getvalue())
        finally:
            stop_stack()


@pytest.fixture(scope="module")
def spine_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedSession]:
    """make test's session (marker ``spine``): the plain Prometheus target, 24 h of gpu-memory's history, the
    ``demo-history`` profile. Scenarios: happy on gpu-memory, drift on gpu-utilization (tests/e2e/test_demo_e2e.py).
    After it: no ``airflow standalone`` of this session is left running."""
    tmp = tmp_path_factory.mktemp("spine")
    with shared_session(tmp, env={}, nodes=12, history_s=24 * 3600.0, history_groups=("gpu-memory",)) as shared:
        # The two runs overlap (each waits minutes for its warm-up): drift starts once happy's dual-write is
        # deployed, so drift's snapshot of the source config holds happy's entry and its rollback restores it.
        shared.start("happy", group="gpu-memory", scenario="happy")
        shared.wait_deployed("happy", "gpu-memory")
        shared.start("drift", group="gpu-utilization", scenario="drift")
        try:
            yield shared
        finally:
            shared.join()  # never stop the stack under a run (a test asked for by -k may not have waited for both)
    left = [pid for pid in proc_pids() if "airflow standalone" in " ".join(proc_cmdline(pid))
            and str(tmp) in proc_environ(pid)]
    assert left == [], "stack down left Airflow running"


@pytest.fixture(scope="module")
def fleet_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedSession]:
    """``make demo SCENARIO=fleet`` in a shared session: 12 + 6 nodes, two sources, two AMP workspaces (the local
    AWS: one front door, a target Prometheus and a signing relay per workspace), one Airflow; both waves run before
    the first test reads them (each group's ``ScenarioRun`` under ``fleet:<group>``)."""
    from promshift.local.demo_fleet import run_waves, write_fleet_catalog

    tmp = tmp_path_factory.mktemp("fleet")
    with shared_session(tmp, env={}, unset=("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"),
                        nodes=12, clusters=2, catalog=write_fleet_catalog, target_kind="amp",
                        profile=QUICK_PROFILE) as shared:
        try:
            with captured_output() as printed:
                outs = run_waves(shared.session, report_root=tmp / "reports")
            for group, out in outs.items():
                shared.runs[f"fleet:{group}"] = ScenarioRun(json.loads((out / "report.json").read_text()), out,
                                                            printed.getvalue(), "", {})
        except BaseException as exc:  # noqa: BLE001 - every test of the module sees it (SharedSession.run)
            for group in ("gpu-utilization", "gpu-memory", "gpu-power-thermal"):
                shared.runs[f"fleet:{group}"] = exc
        yield shared


def proc_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def proc_cmdline(pid: int) -> list[str]:
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def proc_environ(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return ""
